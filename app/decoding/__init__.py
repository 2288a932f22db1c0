"""Speculative decoding, independent of any UI. It talks to llama.cpp only through `specchat.llama`.

- `sampling`: temperature, top-k, top-p and min-p as pure numpy functions, the same for target and draft.
- `verify`: the acceptance rule, for sampled drafts, copies (point masses), greedy decoding and trees.
- `constraint`: a grammar's token masks over the target's distribution (llguidance), followed through the
  committed tokens and the guesses, so that a constrained answer is exactly the constrained target's.
- `toolgrammar`: the grammar of a forced tool call (`tool_choice` "required" or a named function) in the
  form the model's template writes, each call's arguments held to its tool's schema.
- `guessers`: what proposes the next tokens, behind one interface: lookup, history, draft, mtp, auto (which
  may send copies that part ways as one tree), and the registry that builds them by name.
- `policy`: the cost model, acceptance estimates and their priors, the draft length that pays, and the
  loss account that caps what a guess may risk.
- `calibrate`: this machine's decode cost curve, measured and checked before it is trusted.
- `timing`: step times learned from real steps, correcting the calibration into the live curve.
- `history`: the index of past conversations' texts that the history guesser copies from.
- `engine`: the decode loop that turns a prompt into events: propose, verify in one batch, keep the path
  the rule took, take back the rest.
- `events`: the frozen `Prefill`, `Step` and `Done` events that every consumer reads.
- `textstream`: token bytes as text that never splits a UTF-8 character or leaks part of a stop string.
"""
