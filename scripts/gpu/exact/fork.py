"""Fork under a busy PyTorch process (run under the hook): DataLoader workers forked while the main
thread allocates, then 20 forked children that touch CUDA (the driver refuses them). Prints one
FORK_RESULT line: nothing may hang. Used by scripts/gpu/rounds/hardening and scripts/gpu/rounds/hotpath."""
import multiprocessing as mp, os, sys, time, torch
from torch.utils.data import DataLoader, Dataset
import gpumemhook

class Numbers(Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i): return torch.full((256,), float(i))

def child_touches_cuda(q):
    try:
        torch.empty(1024, device="cuda")
        q.put("allocated (unexpected)")
    except Exception as e:
        q.put("refused: " + type(e).__name__)

def main():
    x = [torch.empty(2**20, device="cuda") for _ in range(4)]
    start = time.time()
    batches = 0
    for epoch in range(3):
        for b in DataLoader(Numbers(), batch_size=64, num_workers=4):
            x.append(b.cuda())
            if len(x) > 32:
                x.pop(0)
            batches += 1
    ctx = mp.get_context("fork")
    outcomes = []
    for _ in range(20):
        q = ctx.Queue()
        p = ctx.Process(target=child_touches_cuda, args=(q,))
        p.start()
        p.join(30)
        hung = p.is_alive()
        if hung:
            p.kill()
        outcomes.append("HUNG" if hung else q.get(timeout=5))
    torch.cuda.synchronize()
    s = gpumemhook.stats(0)
    used = s["used"] if isinstance(s, dict) else s.used
    print("FORK_RESULT batches=%d forks=%d hung=%d outcomes=%s seconds=%.1f hook_used=%d reserved=%d"
          % (batches, len(outcomes), outcomes.count("HUNG"), sorted(set(outcomes)), time.time() - start,
             used, torch.cuda.memory_reserved()))

if __name__ == "__main__":
    main()
