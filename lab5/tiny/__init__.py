"""The embedded default model of lab 5: a tiny LLaMA that the repository trains itself.

corpus.py writes the training text (short stories from a small grammar, written for this repo) and
train.py trains a byte-level BPE tokenizer and a small LlamaForCausalLM on it, saving a Hugging Face
checkpoint directory (lab5/models/tiny-llama/ by default) that works on a fresh clone with no network.
Import from `lab5/` as `import tiny` (the way lab 5's tests import `llama`).
"""
