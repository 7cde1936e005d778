"""Helpers shipped for users' own tests: tiny GGUF models for a real llama.cpp server."""
