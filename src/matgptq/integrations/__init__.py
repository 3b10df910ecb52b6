"""matgptq inside other engines: transformers' `from_pretrained` (transformers.py)."""
