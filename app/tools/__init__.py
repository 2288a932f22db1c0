"""The commands for measuring specchat rather than using it: `bench` (plain vs speculative, side by
side), `measure` (the reference's acceptance measurements), `costs` (this machine's decode cost
curve), `endurance` (a long scripted session through the real app), with `replay` (what a guesser
would have done on a fixed text, and the oracle that bounds it), `reading` (what a model says at every
position of an answer) and `promptsets` (the JSONL prompt files) beneath them. `bench/corpus` judges auto
on recorded answers with `recorded` (the answers and cost curves), `judging` (auto replayed on them),
`fitting` (its priors fitted on them) and `predict` (which signals predict a copy's fate); `ties` judges
greedy partings for the tests and endurance.
"""
