"""Cache-equivalence verification (harness, adapters, mutants, :mod:`.api`) and the speculative-decoding verifier."""
