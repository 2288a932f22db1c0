"""llama.cpp, wrapped for a batch-1 speculative engine: `model` loads a GGUF through
llama-cpp-python's low-level API and keeps a KV cache with checked rewind; `template` turns a
conversation into prompt tokens with the GGUF's own chat template, reusing the cached prefix;
`renderer` runs that template (untrusted code) in a sandboxed, time- and memory-limited process.

Importing this package loads nothing: the renderer process imports `renderer` and must stay small.
"""
