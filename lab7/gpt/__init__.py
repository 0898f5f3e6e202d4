"""Lab 7 tasks 06 and 07: a GPT trained through your kernels of tasks 01-05, and its step as a CUDA graph.

    kernels.py  (given) the five task files built into one library, and their C entry points
    ops.py      (task 06) each kernel as a PyTorch operator (torch.library): fake and autograd
    model.py    (given) the GPT-2-shaped model, written with the operators of ops.py
    train.py    (task 06) the parameter arena, the training step and its non-finite check
    data.py     (given) the token stream of lab 5's story corpus, and the batches
    graphed.py  (task 07) the forward and backward pass captured once and replayed as a CUDA graph

`python -m gpt.train` (from lab7/) trains the model for 300 steps and prints the loss curve.
"""
