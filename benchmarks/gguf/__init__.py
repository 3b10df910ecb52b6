"""GGUF claims, scored by llama.cpp's own tools: the default path against Q4_0 (default) and our files against
llama.cpp's presets (presets)."""
