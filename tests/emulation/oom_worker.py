"""A training program whose worker the kernel OOM-kills at every start (it SIGKILLs itself, as
the OOM killer would); its local peer lives on until the agent stops it."""

import os
import signal
import time

if os.environ.get("LOCAL_RANK") == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
