#!/usr/bin/env python3
"""A couple of GPT-2 (124M) training steps on CUDA at a given batch: the program `scripts/gpu/fit/gpt2.py`
hands to `gpumemhook fit`. Random weights from `transformers.GPT2Config()` (no network), sequence
1024, AdamW, fp32. Exits 0 when the steps ran; an out-of-memory error ends it with a traceback and
exit status 1, as any training script would.

    python3 scripts/gpu/workloads/gpt2_step.py --batch 8 [--steps 2] [--seq 1024]
"""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(n_positions=max(1024, args.seq))
    model = GPT2LMHeadModel(config).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")
    for _ in range(args.steps):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"batch {args.batch}: {args.steps} steps, loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
