"""Cache-equivalence verification: adapters (:mod:`.adapters`), the step-by-step harness (:mod:`.harness`), the
mutants that test it (:mod:`.mutants`), the library entry points (:mod:`.api`) and the speculative-decoding
verifier (:mod:`.speculative`)."""
