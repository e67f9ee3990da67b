"""Attention diagnostics after the article 《为什么你的模型总学不会长程依赖？》 ("Why does your model never learn
long-range dependencies?"), its checklist of hidden attention failures made measurable: capture,
entropy / long-range mass, mask validation, padding leaks,
Q/K/V gradient tracking, synthetic long-range tasks and position-encoding extrapolation."""

from .capture import AttentionCapture, AttentionUnavailableError, capture_attention
from .gradients import QKVGradTracker
from .leak import LeakReport, padding_leak
from .masks import Finding, check_masks, load_batch_jsonl
from .metrics import HeadStats, attention_report, format_table, head_stats, per_position

__all__ = [
    "AttentionCapture",
    "AttentionUnavailableError",
    "Finding",
    "HeadStats",
    "LeakReport",
    "QKVGradTracker",
    "attention_report",
    "capture_attention",
    "check_masks",
    "format_table",
    "head_stats",
    "load_batch_jsonl",
    "padding_leak",
    "per_position",
]
