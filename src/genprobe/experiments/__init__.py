"""The experiments of the chapter 《训练与推理的两副面孔》 ("The two faces of training and inference"), as functions
returning typed results; their JSON forms (``json_safe``) are the keys of ``ch3_case.json`` (:mod:`.case` runs them
all and writes the files, :mod:`.phenomena` measures the training-free ones on any model)."""
