"""A plain long-running component that checkpoints: the stand-in for a trainer in the node-loss test.

    python counter.py CHECKPOINT_JSON [--resume]

Every 0.1 s it counts one step and writes {"step", "node"} to CHECKPOINT_JSON (atomically). With
--resume it continues from the step in the checkpoint, as the real trainer does from its last one.
"""

import json
import os
import sys
import time

checkpoint = sys.argv[1]
step = 0
if "--resume" in sys.argv[2:] and os.path.exists(checkpoint):
    with open(checkpoint) as f:
        step = json.load(f)["step"]
    print(f"resumed from step {step}", flush=True)
while True:
    step += 1
    tmp = f"{checkpoint}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "node": os.environ.get("SLURMD_NODENAME")}, f)
    os.replace(tmp, checkpoint)
    if step % 20 == 0:
        print(f"step {step}", flush=True)
    time.sleep(0.1)
