"""llama-server's cache model: slots, per-slot prefix reuse, context checkpoints, the host-memory
prompt cache and slot files, each rule written from llama.cpp's own source (tools/server at the
build the `xllamacpp` wheel pins, b11549) and naming the function it models. Compiled with mypyc.
"""
