"""Attention diagnostics after the article 《为什么你的模型总学不会长程依赖？》 ("Why does your model never learn
long-range dependencies?"), its checklist of hidden attention failures made measurable: capture, entropy / long-range
mass, mask validation, padding leaks, Q/K/V gradient tracking, synthetic long-range tasks and position-encoding
extrapolation."""
