from __future__ import annotations
import resource, time, httpx, threading
from concurrent.futures import ThreadPoolExecutor
from .conftest import make_images
from .server_helpers import put_shard, extract, TIMEOUT
from hapi_contract import FrameDecoder

def vmdata(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmData"):
            return int(l.split()[1]) * 1024

def run(server, dataset, shard, b_max, n, side=224):
    def one(i):
        dec = FrameDecoder()
        body = dataset.request("resnet18", shard, 4, b_max=b_max, transform={**dataset.transform(), "resize": side, "crop": side})
        try:
            with httpx.stream("POST", f"{server.url}/v1/extract", json=body, headers=dataset.headers(), timeout=TIMEOUT) as r:
                if r.status_code != 200:
                    return f"status {r.status_code} {r.read()[:300]!r}"
                for c in r.iter_bytes():
                    dec.feed(c)
            return f"ok {dec.close().meta['cos_batch_sizes']}"
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:300]}"
    with ThreadPoolExecutor(n) as p:
        return list(p.map(one, range(n)))

class Peak:
    def __init__(self, pid):
        self.pid=pid; self.peak=0; self.stop=False
        self.t=threading.Thread(target=self.loop); self.t.start()
    def loop(self):
        while not self.stop:
            try: self.peak=max(self.peak, vmdata(self.pid))
            except Exception: return
            time.sleep(0.01)
    def done(self):
        self.stop=True; self.t.join(); return self.peak

def test_explore(server_factory, swift_stack, dataset):
    put_shard(swift_stack, "oom/s48.tar", *make_images(48, seed=3))
    put_shard(swift_stack, "oom/s4.tar", *make_images(4, seed=4))
    H = 200 * 2**20
    for adaptation in (True, False, True):
        s = server_factory(cpu_memory_budget_bytes=(45+100)*2**20, framework_reserve_bytes=0, b_min=1, adaptation=adaptation, adaptation_window_s=0.2)
        pid = s.process.pid
        t=time.time(); print("\nadaptation", adaptation, "warm", run(s, dataset, "oom/s4.tar", 1, 10), round(time.time()-t,1))
        base = vmdata(pid); print("base MiB", base/2**20)
        resource.prlimit(pid, resource.RLIMIT_DATA, (base + H, base + H))
        p = Peak(pid); t=time.time()
        r = run(s, dataset, "oom/s48.tar", 48, 10)
        print("10 x 48:", r, "peak growth MiB", (p.done()-base)/2**20, "t", round(time.time()-t,1))
        print("after", run(s, dataset, "oom/s4.tar", 1, 1), "growth", (vmdata(pid)-base)/2**20)
        s.stop()
