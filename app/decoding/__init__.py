"""Speculative decoding, independent of any UI: sampling and the acceptance rule as pure numpy
functions (`sampling`, `verify`), the guessers that propose tokens behind one interface
(`guessers`), the policy that decides how many to propose from this machine's measured costs and
the acceptance seen so far (`policy`, measured by `calibrate`), and the decode loop that turns a
prompt into a stream of `Prefill`, `Step` and `Done` events (`engine`, with `textstream` turning
tokens into text that never splits a UTF-8 character or leaks part of a stop string). It talks to
llama.cpp only through `specchat.llama`.
"""
