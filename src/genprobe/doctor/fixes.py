"""Which fix: the decode-time fixes the user's engine offers, side by side on the same prompts
(:func:`genprobe.loops.compare_fixes.compare_fixes`), optionally the weight edit found by the existing repair
(:func:`genprobe.api.repair_loops`'s pipeline, :func:`genprobe.loops.repair.repair`), and a recommendation that
states its evidence and its cost."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from typing import Any

from .._io import json_safe
from ..loops.compare_fixes import EDIT, CompareConfig, CompareResult, compare_fixes
from ..loops.study import RepairConfig, RepairInputs
from ..metrics.calibrate import LoopCalibration
from .options import QUICK_SKIP, DoctorRun, Finding, StageSkipped

# The decode-time fixes each engine offers (loops compare's method names); genprobe's engine has all of them.
ENGINE_METHODS: dict[str, tuple[str, ...]] = {
    "genprobe": ("sample", "rep-1.2", "no-repeat-3", "pres-freq", "dry"),
    "hf": ("sample", "rep-1.2", "no-repeat-3", "contrastive"),
    "vllm": ("sample", "rep-1.2", "pres-freq"),
    "llama.cpp": ("sample", "rep-1.2", "pres-freq", "dry", "xtc"),
}
EDIT_CONFIG = dict(
    n_direction=64,
    n_search=32,
    n_validate=32,
    ks=(8,),
    forms=("subtract",),
    transfer=0,
    plain_greedy_check=0,
    regression_windows=32,
    search_prone=16,
    search_control=32,
)


@dataclass
class FixComparison:
    """The comparison, the repair's summary when the edit was tried, and the recommendation."""

    engine: str
    methods: list[str]
    compare: CompareResult
    repair: dict[str, Any] | None
    recommendation: str
    findings: list[Finding] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One row per method: degenerate rate with its interval, exact loops, speed, NLL per character."""
        return [
            {
                "name": m.method.name,
                "label": m.method.label,
                "degenerate_rate": m.rates.degenerate_rate,
                "degenerate_ci95": m.rates.degenerate_rate_ci95,
                "loop_rate": m.rates.loop_rate,
                "speed_vs_greedy": m.cost.speed_vs_greedy,
                "nll_per_char": m.nll_own.nll_per_char,
                "sample": m.samples[0] if m.samples else None,
            }
            for m in self.compare.methods
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the rows, the comparison's best choice and rule, the repair, the recommendation."""
        c = json_safe(self.compare)
        own = json_safe({f.name: getattr(self, f.name) for f in fields(self) if f.name != "compare"})
        best = {k: c[k] for k in ("best", "best_rule", "n_prompts")}
        return own | best | {"rows": self.rows(), "max_new_tokens": c["config"]["max_new_tokens"]}


def compare(run: DoctorRun) -> FixComparison:
    """Compare the engine's fixes on the run's first prompts (and the edit searched on the edit prompts when asked),
    with the degeneration stage's calibrated detectors when it ran."""
    model, opts, b, log = run.model, run.opts, run.opts.plan, run.note
    if b.fix_prompts == 0:
        raise StageSkipped(QUICK_SKIP)
    prompts = run.prompts()[: b.fix_prompts]
    deg = run.report.degeneration
    calibration: LoopCalibration | None = deg.calibration if deg is not None else None
    methods = list(ENGINE_METHODS.get(opts.engine or "genprobe", ENGINE_METHODS["genprobe"]))
    patch, repair_summary = None, None
    if opts.with_edit:  # the repair's patch (None when no edit passed its limits), searched on the edit prompts
        from ..loops.repair import repair

        if run.inputs.val_text is None:
            raise ValueError("the weight edit needs held-out text of the model's language for its regression limits")
        cfg = RepairConfig(max_new_tokens=b.scan_tokens, seed=opts.seed, **EDIT_CONFIG)  # type: ignore[arg-type]
        cfg.loop = calibration.settings if calibration is not None else cfg.loop
        edit_prompts, val_text = run.inputs.edit_prompts, run.inputs.val_text
        inputs = RepairInputs.from_prompts(edit_prompts, val_text, cfg, "doctor prompts", "doctor validation text")
        report, patch = repair(model, inputs, cfg, log=log)
        d = json_safe(report)
        repair_summary = {k: d.get(k) for k in ("verdict", "patch", "timings_s")}
    methods += [EDIT] if patch is not None else []
    loop = calibration.settings if calibration is not None else CompareConfig().loop
    cc = CompareConfig(
        max_new_tokens=b.scan_tokens,
        batch_size=64,
        seed=opts.seed,
        loop=loop,
        methods=tuple(["greedy", *methods]),
        engine=None if opts.engine in (None, "genprobe") else opts.engine,  # the fixes as the user's engine runs them
        timing_rounds=1,
        samples=2,
    )
    result = compare_fixes(model, prompts, cc, patch=patch, prompt_source="doctor prompts", log=log)
    fc = FixComparison(opts.engine or "genprobe", ["greedy", *methods], result, repair_summary, "")
    fc.recommendation = recommend(fc)
    cmd = (
        f"genprobe loops compare {run.arg} {opts.prompts_arg()} --max-new-tokens {b.scan_tokens} "
        f"--methods {shlex.join(['greedy', *[m for m in methods if m != EDIT]])}"
    )
    best = result.best
    ev = {"rows": fc.rows(), "best": json_safe(best) if best else None, "repair": repair_summary}
    fc.findings = [Finding("fixes", "which_fix", "info", fc.recommendation, ev, best.rule if best else None, cmd)]
    return fc


def recommend(fc: FixComparison) -> str:
    """One paragraph: the best decode-time fix against greedy with its evidence and cost, the edit's when tried."""
    rows = {r["name"]: r for r in fc.rows()}
    greedy = rows["greedy"]
    best = fc.compare.best
    if best is None or best.name is None:
        return "no decode-time fix was compared"
    r = rows[best.name]
    speed, n = r["speed_vs_greedy"], len(fc.compare.prompts)
    nll = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
    cost = "speed not measured" if speed is None else f"{speed:.2f}x greedy's speed"
    text = (
        f"{'use' if best.acceptable else 'no fix met every limit; least bad:'} {r['label']} — degenerate "
        f"{r['degenerate_rate']:.1%} vs greedy {greedy['degenerate_rate']:.1%} on {n} prompts; cost {cost}, NLL "
        f"{nll(r['nll_per_char'])} vs greedy {nll(greedy['nll_per_char'])} nats/char under the model"
    )
    if EDIT in rows:
        e = rows[EDIT]
        helps = "lowers" if e["degenerate_rate"] < greedy["degenerate_rate"] else "does not lower"
        search_s = (fc.repair or {}).get("timings_s", {}).get("total")
        text += (
            f". The weight edit {helps} greedy's rate: degenerate {e['degenerate_rate']:.1%}, no decode-time cost "
            f"(a one-off search of {'?' if search_s is None else f'{search_s:.0f}'} s, a reversible patch)"
        )
    elif fc.repair is not None:
        text += f". The weight edit search found no edit within its limits ({fc.repair.get('verdict')})"
    return text
