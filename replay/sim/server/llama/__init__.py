"""The simulator serving llama-server's API, flags and log over the llama cache model."""
