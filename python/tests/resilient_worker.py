"""A resilient torch loop whose state provider raises at a chosen step (for
test_resilient_torch.py): run by `commgrid launch --spares S`; every process prints
"error: ..." and exits 1 once the job ends."""
import argparse
import sys

import torch
import torch.distributed as dist

import commgrid.torch as cgt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--fail-save-at", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    driver = cgt.ResilientDriver(snapshot_every=1)
    live = {}
    at = {"step": 0}

    def start_epoch(epoch):
        live["epoch"] = epoch
        live["x"] = torch.zeros(4)

    def step(n):
        at["step"] = n + 1
        t = torch.full((4,), float(n))
        dist.all_reduce(t, group=live["epoch"].group("dp"))
        live["x"] += t

    def state_dict():
        if at["step"] == args.fail_save_at:
            raise ValueError("no state today")
        return {"x": live["x"]}

    def load_state_dict(state):
        live["x"].copy_(state["x"])

    try:
        driver.run(args.steps, start_epoch=start_epoch, stop_epoch=live.clear, step=step,
                   state_dict=state_dict, load_state_dict=load_state_dict)
    except cgt.RecoveryError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
