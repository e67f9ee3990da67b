"""Loop observatory and directional repair: scan, contrast, direction, locate, edit, patch.

The repair follows the article 《大模型推理死循环的定点修复机制》 ("A targeted fix for inference loops
in large models"): find a loop direction, edit a few MLP down-projection columns, check the cost.
"""
