"""Issue #29: the public names. ``genprobe.SamplingParams`` is a class of that name (not an alias whose repr and
errors say ``SamplerConfig``), and every type a public function returns is exported from ``genprobe``."""

from __future__ import annotations

import builtins
import inspect
import re
import subprocess
import sys

import pytest

import genprobe
from genprobe._io import json_safe
from genprobe.engine.samplers.stages import SamplerConfig


def test_sampling_params_says_its_own_name():
    p = genprobe.SamplingParams(temperature=0.8, top_p=0.9)
    assert type(p).__name__ == "SamplingParams" and repr(p).startswith("SamplingParams(greedy=False, temperature=0.8")
    assert type(genprobe.SamplingParams.preset("hf")) is genprobe.SamplingParams
    assert type(p.replace(top_p=0.5)) is genprobe.SamplingParams
    with pytest.raises(
        TypeError, match=r"SamplingParams\.__init__\(\) got an unexpected keyword argument 'tempreature'"
    ):
        genprobe.SamplingParams(tempreature=0.8)
    with pytest.raises(ValueError, match="top_p must be in"):
        genprobe.SamplingParams(top_p=1.5)


def test_sampling_params_stays_compatible_with_sampler_config():
    p = genprobe.SamplingParams(temperature=0.8, top_p=0.9)
    c = SamplerConfig(temperature=0.8, top_p=0.9)
    assert isinstance(p, SamplerConfig)
    assert p == c and c == p and hash(p) == hash(c) and len({p, c}) == 1
    assert json_safe(p) == json_safe(c)
    assert p != SamplerConfig(temperature=0.7, top_p=0.9)
    assert repr(c).startswith("SamplerConfig(")  # the internal name keeps its own


def _functions():
    for name in genprobe.__all__:
        obj = getattr(genprobe, name)
        if inspect.isfunction(obj):
            yield name, obj


def test_every_public_function_returns_an_exported_type():
    exported = {getattr(genprobe, n).__name__ for n in genprobe.__all__ if inspect.isclass(getattr(genprobe, n))}
    missing = {}
    for name, fn in _functions():
        ann = inspect.signature(fn).return_annotation
        assert ann is not inspect.Signature.empty, f"genprobe.{name} has no return annotation"
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
        for word in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", text.strip("'\"")):
            word = word.rsplit(".", 1)[-1]
            json_value = name == "json_safe" and word == "Any"  # the JSON form: any JSON value
            if (
                word not in exported
                and not hasattr(builtins, word)
                and word not in ("None", "Optional")
                and not json_value
            ):
                missing[name] = word
    assert len(list(_functions())) >= 9
    assert missing == {}


def test_the_result_types_issue_29_names_are_exported():
    for name in ("ScanResult", "VerifyReport", "RepairReport", "Patch", "LoopCalibration", "CompareResult"):
        assert name in genprobe.__all__ and getattr(genprobe, name).__name__ == name


def test_serving_report_is_exported_without_importing_vllm():
    code = "import sys, genprobe; genprobe.ServingReport; print('vllm' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr
