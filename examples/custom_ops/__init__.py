"""Custom op libraries of the examples (import as ``custom_ops.<name>`` with examples/ on the
path, and allow them with ``model_runtime.configure(custom_op_libraries=[...])``)."""
