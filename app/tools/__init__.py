"""The commands for measuring specchat rather than using it: `bench` (plain vs speculative, side by
side), `measure` (the reference's acceptance measurements), `costs` (this machine's decode cost
curve), `endurance` (a long scripted session through the real app), with `replay` (what a guesser
would have done on a fixed text) and `promptsets` (the JSONL prompt files) beneath them.
"""
