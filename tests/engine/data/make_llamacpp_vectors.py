"""Write llamacpp_vectors.json: cases with ties, -inf entries and exactly-hit thresholds, run through
llama.cpp's real samplers by llamacpp_harness.cpp (not part of the test run; llama.cpp is C++).

    git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp && git checkout d1b67c94
    cmake -B build -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF && cmake --build build --target llama
    g++ -O2 -std=c++17 -Iinclude -Iggml/include llamacpp_harness.cpp -Lbuild/bin -lllama \\
        -Wl,-rpath,build/bin -o harness
    python tests/engine/data/make_llamacpp_vectors.py path/to/harness
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LEVELS = np.array([-3.0, -1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, -np.inf], dtype=np.float32)


def tie_logits(rng: np.random.Generator, V: int) -> list[float]:
    z = LEVELS[rng.integers(0, len(LEVELS), V)]
    z[0] = 0.0
    return [float(x) for x in z]


def case(name, logits, stages, history=(), breakers=()):
    return {"name": name, "logits": list(logits), "stages": [list(s) for s in stages], "history": list(history),
            "breakers": [list(b) for b in breakers]}


def build_cases() -> list[dict]:
    rng = np.random.default_rng(0)
    cases = []
    for i in range(40):
        cases.append(case(f"top_k_ties_{i}", tie_logits(rng, 12), [("top_k", int(rng.integers(1, 12)))]))
    wide = [float(x) for x in np.round(rng.normal(size=300), 1).astype(np.float32)]  # ties; k > 128: bucket sort
    cases += [case("top_k_bucket_150", wide, [("top_k", 150)]), case("top_k_bucket_200", wide, [("top_k", 200)])]
    for n in range(2, 25):
        for m in range(1, n):
            cases.append(case(f"top_p_equal_{n}_{m}", [0.0] * n, [("top_p", m / n)]))
    for i in range(40):
        p = [0.3, 0.5, 0.75, 0.9, 0.95][i % 5]
        cases.append(case(f"top_p_ties_{i}", tie_logits(rng, 12), [("top_p", p)]))
    for p in (0.05, 0.1, 0.25, 0.5):
        edge = float(np.log(np.float32(p)))  # logit == max + logf(p): kept (>=)
        below = float(np.nextafter(np.float32(edge), np.float32(-10)))
        cases.append(case(f"min_p_exact_{p}", [0.0, edge, below, edge, -5.0], [("min_p", p)]))
    for i in range(30):
        cases.append(case(f"min_p_ties_{i}", tie_logits(rng, 12), [("min_p", [0.05, 0.1, 0.3, 0.6][i % 4])]))
    for i in range(30):
        cases.append(case(f"typical_ties_{i}", tie_logits(rng, 12), [("typical", [0.2, 0.5, 0.9][i % 3])]))
    for n in (3, 4, 7):
        cases.append(case(f"typical_equal_{n}", [0.0] * n, [("typical", 0.5)]))
    for i in range(30):
        cases.append(case(f"top_n_sigma_ties_{i}", tie_logits(rng, 12), [("top_n_sigma", [0.5, 1.0, 2.0][i % 3])]))
    for i in range(30):
        cases.append(case(f"xtc_ties_{i}", tie_logits(rng, 12), [("xtc", 1.0, [0.05, 0.1, 0.2, 0.25, 0.5][i % 5])]))
    cases.append(case("xtc_equal_exact", [0.0] * 4, [("xtc", 1.0, 0.25)]))
    for i in range(30):
        hist = [int(t) for t in rng.integers(0, 10, int(rng.integers(1, 15)))]
        z = tie_logits(rng, 10)
        st = ("penalties", int(rng.integers(1, 10)), [1.3, 0.8, 2.0][i % 3], [0.0, 0.5][i % 2],
              [0.0, 0.3][(i // 2) % 2])
        cases.append(case(f"penalties_{i}", z, [st], history=hist))
    cases += dry_cases(rng)
    for i in range(20):  # llama.cpp's default order with its preset values, plus penalties and DRY
        hist = [int(t) for t in rng.integers(0, 16, 40)]
        z = [float(x) for x in np.round(rng.normal(scale=2.0, size=64), 1)]
        stages = [("penalties", 64, 1.1, 0.1, 0.1), ("dry", 0.8, 1.75, 2, -1), ("top_k", 40), ("top_p", 0.95),
                  ("min_p", 0.05), ("xtc", 1.0, 0.1), ("temp", 0.8)]
        cases.append(case(f"chain_{i}", z, stages, history=hist, breakers=[[3], [5, 6]]))
    return cases


def dry_cases(rng: np.random.Generator) -> list[dict]:
    out = []
    for i in range(40):  # short alphabets repeat a lot
        hist = [int(t) for t in rng.integers(0, 4, int(rng.integers(3, 40)))]
        brk = [[[3]], [], [[2, 1]], [[1, 0, 2]]][i % 4]
        st = ("dry", [0.8, 2.0][i % 2], [1.75, 1.1][(i // 2) % 2], [1, 2, 3][i % 3], [-1, 8, 20][(i // 3) % 3])
        out.append(case(f"dry_{i}", tie_logits(rng, 6), [st], history=hist, breakers=brk))
    period = [0, 1] * 200  # a repeat of ~400 tokens: the exponent cap decides
    out.append(case("dry_cap_base_1.75", [0.0] * 4, [("dry", 1.0, 1.75, 2, -1)], history=period))
    out.append(case("dry_cap_base_2", [0.0] * 4, [("dry", 1.0, 2.0, 2, -1)], history=period))
    out.append(case("dry_breaker_candidate", [0.0] * 5, [("dry", 1.0, 1.75, 1, -1)], history=[0, 1, 2, 0, 1, 2, 0, 1],
                    breakers=[[2]]))
    return out


def harness_input(cases: list[dict]) -> str:
    lines = []
    for c in cases:
        lines += [f"CASE {c['name']}", "LOGITS " + " ".join("-inf" if np.isneginf(x) else repr(x) for x in c["logits"])]
        if c["history"]:
            lines.append("HISTORY " + " ".join(map(str, c["history"])))
        lines += ["BREAKER " + " ".join(map(str, b)) for b in c["breakers"]]
        lines += ["STAGE " + " ".join(map(str, s)) for s in c["stages"]]
        lines.append("END")
    return "\n".join(lines) + "\n"


def main() -> None:
    cases = build_cases()
    out = subprocess.run([sys.argv[1]], input=harness_input(cases), capture_output=True, text=True, check=True)
    results = {r["name"]: r for r in json.loads(out.stdout)}
    for c in cases:
        c["expected_ids"] = results[c["name"]]["ids"]
        c["expected_logits"] = results[c["name"]]["logits"]
    head = {"reference": "ggml-org/llama.cpp d1b67c94 (2026-05-30), src/llama-sampler.cpp via llamacpp_harness.cpp"}
    body = ",\n".join(json.dumps(c) for c in cases)
    (HERE / "llamacpp_vectors.json").write_text(
        f'{{"reference": {json.dumps(head["reference"])},\n"cases": [\n{body}\n]}}\n', encoding="utf-8")


if __name__ == "__main__":
    main()
