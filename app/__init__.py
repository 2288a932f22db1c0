"""specchat: a local chat app over exact speculative decoding on llama.cpp."""

__version__ = "0.1.0"
