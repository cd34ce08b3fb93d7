"""Programs the 2-process tests start with ``mpiexec -n N python -m tests.dist.mpi_cases CASE``.

Each case prints one ``RESULT {json}`` line per rank; ``tests/dist/test_distributed.py`` runs
them and checks the numbers. Every rank also computes the serial reference (one process with
the whole global batch, or a serial simulation of the same algorithm over N replicas) from
the same data, so each rank checks itself.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

from workbench import autograd, layer, model, opt, tensor

D_IN, N_CLASSES = 12, 4


class MLP(model.Model):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = layer.Linear(16), layer.Linear(8), layer.Linear(N_CLASSES)

    def forward(self, x):
        return self.fc3(autograd.relu(self.fc2(autograd.relu(self.fc1(x)))))

    def train_one_batch(self, x, y, mode="plain", threshold=2097152, spars=0.05):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        o = self.optimizer
        if mode == "plain":
            o.backward_and_update(loss, threshold=threshold) if isinstance(o, opt.DistOpt) \
                else o.backward_and_update(loss)
        elif mode == "half":
            o.backward_and_update_half(loss, threshold=threshold, clipping=True, clip_Value=5)
        elif mode == "partial":
            o.backward_and_partial_update(loss, threshold=threshold)
        elif mode in ("topk", "thresh", "topk_nocorr"):
            o.backward_and_sparse_update(loss, threshold=threshold, spars=spars,
                                         topK=mode != "thresh", corr=mode != "topk_nocorr")
        return loss


class BNNet(model.Model):
    def __init__(self):
        super().__init__()
        self.conv = layer.Conv2d(1, 4, 3, padding=1)
        self.bn = layer.BatchNorm2d(4)
        self.fc = layer.Linear(N_CLASSES)

    def forward(self, x):
        y = autograd.relu(self.bn(self.conv(x)))
        return self.fc(autograd.flatten(y))

    def train_one_batch(self, x, y):
        loss = autograd.softmax_cross_entropy(self.forward(x), y)
        self.optimizer.backward_and_update(loss)
        return loss


OPTIMIZERS = {
    "sgd": lambda: opt.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4),
    "nesterov": lambda: opt.SGD(lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda: opt.Adam(lr=0.01),
    "adamw": lambda: opt.AdamW(lr=0.01, weight_decay=0.01),
    "rmsprop": lambda: opt.RMSProp(lr=0.01),
    "adagrad": lambda: opt.AdaGrad(lr=0.05),
}


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, D_IN)).astype(np.float32)
    w = rng.standard_normal((D_IN, N_CLASSES)).astype(np.float32)
    y = (x @ w).argmax(1).astype(np.int32)
    return x, y


def build(cls, batch, optimizer, seed):
    tensor.seed(seed)
    m = cls()
    m.set_optimizer(optimizer)
    shape = (batch, D_IN) if cls is MLP else (batch, 1, 6, 6)
    m.compile([tensor.PlaceHolder(shape)], is_train=True, use_graph=False)
    return m


def params(m):
    return {k: v.numpy().copy() for k, v in m.get_params().items()}


def rel(a: dict, b: dict) -> float:
    """Largest over the parameters of max|a-b| / max|b|."""
    return max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30)) for k in b)


def rel_update(a: dict, b: dict, start: dict) -> float:
    """Largest over the parameters of max|Δa-Δb| / max|Δb| (Δ: change since ``start``)."""
    return max(float(np.abs((a[k] - start[k]) - (b[k] - start[k])).max()
                     / max(np.abs(b[k] - start[k]).max(), 1e-30)) for k in b)


def ranks_max_diff(d: opt.DistOpt, p: dict) -> float:
    flat = np.concatenate([p[k].ravel() for k in sorted(p)])
    allp = d.communicator.all_gather(flat)
    return float(np.abs(allp - allp[0]).max())


def result(d, **kv):
    kv.update(rank=d.global_rank, world_size=d.world_size, backend=d.communicator.backend)
    print("RESULT " + json.dumps(kv), flush=True)


# ------------------------------------------------------------------ cases
def case_equality(a):
    """N ranks with batch b == 1 process with batch N*b (plain, fused and unfused)."""
    d = opt.DistOpt(OPTIMIZERS[a.opt]())
    n, r, b, k = d.world_size, d.global_rank, a.batch, a.steps
    x, y = data(k * n * b)
    # each rank starts from different random weights: compile broadcasts rank 0's
    m = build(MLP, b, d, seed=100 + r)
    ref = build(MLP, n * b, OPTIMIZERS[a.opt](), seed=100)
    start_equal = rel(params(m), params(ref))
    for s in range(k):
        g0 = s * n * b
        m(tensor.from_numpy(x[g0 + r * b:g0 + (r + 1) * b]), y[g0 + r * b:g0 + (r + 1) * b],
          "plain", a.threshold)
        ref(tensor.from_numpy(x[g0:g0 + n * b]), y[g0:g0 + n * b])
    p = params(m)
    result(d, start_equal=start_equal, rel=rel(p, params(ref)), ranks=ranks_max_diff(d, p),
           bytes_per_step=d.bytes_communicated / k)


def case_fused(a):
    """Fused (one buffer) and unfused (one all-reduce per tensor) give the same parameters;
    SINGA's fused_all_reduce / all_reduce give the same sums."""
    n = opt.DistOpt(opt.SGD()).world_size
    d1, d2 = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9)), opt.DistOpt(opt.SGD(lr=0.1,
                                                                              momentum=0.9))
    r, b, k = d1.global_rank, a.batch, a.steps
    x, y = data(k * n * b, seed=3)
    m1, m2 = build(MLP, b, d1, 7 + r), build(MLP, b, d2, 7 + r)
    for s in range(k):
        sl = slice(s * n * b + r * b, s * n * b + (r + 1) * b)
        m1(tensor.from_numpy(x[sl]), y[sl], "plain", 0)          # every tensor alone
        m2(tensor.from_numpy(x[sl]), y[sl], "plain", 2097152)    # all in one buffer
    p1, p2 = params(m1), params(m2)
    diff_models = max(float(np.abs(p1[q] - p2[q]).max()) for q in p1)
    rng = np.random.default_rng(r)
    ts = [rng.standard_normal(sh).astype(np.float32) for sh in [(3, 4), (7,), (2, 2, 2)]]
    a1 = [t.copy() for t in ts]
    for t in a1:
        d1.all_reduce(t)
    a2 = [t.copy() for t in ts]
    for t in a2:
        d1.fused_all_reduce([t], send=False)
    d1.fused_all_reduce(a2)
    d1.wait()
    diff_api = max(float(np.abs(u - v).max()) for u, v in zip(a1, a2))
    h1 = [t.copy() for t in ts]
    for t in h1:
        d1.all_reduce_half(t)
    h2 = [t.copy() for t in ts]
    for t in h2:
        d1.fused_all_reduce_half([t], send=False)
    d1.fused_all_reduce_half(h2)
    diff_half = max(float(np.abs(u - v).max()) for u, v in zip(h1, h2))
    result(d1, diff_models=diff_models, diff_api=diff_api, diff_half=diff_half)


def case_half(a):
    """float16 on the wire vs the float32 serial run: within float16 tolerance."""
    d = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))
    n, r, b, k = d.world_size, d.global_rank, a.batch, a.steps
    x, y = data(k * n * b, seed=5)
    m = build(MLP, b, d, seed=11 + r)
    ref = build(MLP, n * b, opt.SGD(lr=0.1, momentum=0.9), seed=11)
    start = params(ref)
    for s in range(k):
        g0 = s * n * b
        m(tensor.from_numpy(x[g0 + r * b:g0 + (r + 1) * b]), y[g0 + r * b:g0 + (r + 1) * b],
          "half", a.threshold)
        ref(tensor.from_numpy(x[g0:g0 + n * b]), y[g0:g0 + n * b])
    p = params(m)
    result(d, rel_update=rel_update(p, params(ref), start), rel=rel(p, params(ref)),
           ranks=ranks_max_diff(d, p), bytes_per_step=d.bytes_communicated / k)


def _groups(sizes, threshold):
    """SINGA's partition of the tensors: larger than threshold alone, the others grouped
    until a group exceeds threshold (numbered in the order they close)."""
    groups, cur, acc = [], [], 0
    for i, sz in enumerate(sizes):
        if sz > threshold:
            groups.append([i])
        else:
            cur.append(i)
            acc += sz
            if acc > threshold:
                groups.append(cur)
                cur, acc = [], 0
    if cur:
        groups.append(cur)
    return groups


def _grads(m, x, y):
    """(param, gradient array) pairs of one backward pass, in the optimizer's order."""
    loss = autograd.softmax_cross_entropy(m.forward(tensor.from_numpy(x)), y)
    return [(p, g.data.copy()) for p, g in autograd.backward(loss) if p.stores_grad]


def case_partial(a):
    """backward_and_partial_update == a serial simulation over N replicas."""
    d = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))
    n, r, b, k, thr = d.world_size, d.global_rank, a.batch, a.steps, a.threshold
    x, y = data(k * n * b, seed=9)
    m = build(MLP, b, d, seed=21 + r)
    reps = [build(MLP, b, opt.SGD(lr=0.1, momentum=0.9), seed=21) for _ in range(n)]
    partial = 0
    for s in range(k):
        sl = [slice(s * n * b + q * b, s * n * b + (q + 1) * b) for q in range(n)]
        m(tensor.from_numpy(x[sl[r]]), y[sl[r]], "partial", thr)
        partial += 1
        pairs = []
        for q, rep in enumerate(reps):
            pq = _grads(rep, x[sl[q]], y[sl[q]])
            for p, g in pq:
                rep.optimizer.update(p, g)
            pairs.append([p for p, _ in pq])
        groups = _groups([p.size() for p in pairs[0]], thr)
        for i in groups[partial - 1]:
            total = pairs[0][i].data.copy()
            for q in range(1, n):
                total = total + pairs[q][i].data
            for q in range(n):
                pairs[q][i].data = total / np.float32(n)
        if partial == len(groups):
            partial = 0
        for rep in reps:
            rep.optimizer.step()
    p = params(m)
    result(d, rel=rel(p, params(reps[r])), groups=len(groups), ranks=ranks_max_diff(d, p))


def _sparse_select(v, spars, topk):
    if topk:
        kk = int(np.ceil(spars * v.size))
        return np.sort(np.argsort(-np.abs(v), kind="stable")[:kk])
    return np.flatnonzero(np.abs(v) >= np.float32(spars))


def case_sparse(a):
    """backward_and_sparse_update == a serial simulation (per-replica residuals)."""
    mode = a.mode
    d = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))
    n, r, b, k, thr = d.world_size, d.global_rank, a.batch, a.steps, a.threshold
    spars = a.spars
    x, y = data(k * n * b, seed=13)
    m = build(MLP, b, d, seed=31 + r)
    sim = build(MLP, b, opt.SGD(lr=0.1, momentum=0.9), seed=31)
    topk, corr = mode != "thresh", mode != "topk_nocorr"
    residual = None
    sent = 0
    for s in range(k):
        sl = [slice(s * n * b + q * b, s * n * b + (q + 1) * b) for q in range(n)]
        m(tensor.from_numpy(x[sl[r]]), y[sl[r]], mode, thr, spars)
        per = [_grads(sim, x[sl[q]], y[sl[q]]) for q in range(n)]
        ps = [p for p, _ in per[0]]
        groups = _groups([p.size() for p in ps], thr)
        if residual is None:
            residual = [[np.zeros(sum(ps[i].size() for i in grp), np.float32) for grp in groups]
                        for _ in range(n)]
        dense = {}
        for gi, grp in enumerate(groups):
            total = np.zeros(sum(ps[i].size() for i in grp), np.float32)
            for q in range(n):
                v = np.concatenate([per[q][i][1].ravel() for i in grp])
                if corr:
                    v = v + residual[q][gi]
                idx = _sparse_select(v, spars, topk)
                sent += idx.size if q == r else 0
                if corr:
                    residual[q][gi] = v.copy()
                    residual[q][gi][idx] = 0
                total[idx] += v[idx]
            off = 0
            for i in grp:
                dense[i] = total[off:off + ps[i].size()].reshape(ps[i].shape)
                off += ps[i].size()
        for i, p in enumerate(ps):
            sim.optimizer.update(p, dense[i] / np.float32(n))
        sim.optimizer.step()
    p = params(m)
    total_values = sum(p_.size() for p_ in sim.get_params().values())
    result(d, rel=rel(p, params(sim)), ranks=ranks_max_diff(d, p), groups=len(groups),
           sent_fraction=sent / (k * total_values))


def case_transfer(a):
    """SONNXModel cut with last_layers, imported layers frozen, a new head trained."""
    from workbench import sonnx
    n0 = opt.DistOpt(opt.SGD())
    n, r, b, k = n0.world_size, n0.global_rank, a.batch, a.steps
    base = build(MLP, b, opt.SGD(), seed=41)        # the same base model on every rank
    proto = base.to_onnx()

    class Head(sonnx.SONNXModel):
        def __init__(self, onnx_model):
            super().__init__(onnx_model)
            self.head = layer.Linear(3)

        def forward(self, *x):
            y = super().forward(*x, last_layers=-2)[0]
            return self.head(autograd.relu(y))

        def train_one_batch(self, x, y):
            loss = autograd.softmax_cross_entropy(self.forward(x), y)
            self.optimizer.backward_and_update(loss)
            return loss

    def make(batch, optimizer, seed):
        tensor.seed(seed)
        h = Head(proto)
        for p in h.get_params().values():
            if not (p.name or "").startswith("head"):
                p.requires_grad = False
        h.set_optimizer(optimizer)
        h.compile([tensor.PlaceHolder((batch, D_IN))], is_train=True, use_graph=False)
        return h

    d = opt.DistOpt(opt.SGD(lr=0.1, momentum=0.9))
    m = make(b, d, 51 + r)
    ref = make(n * b, opt.SGD(lr=0.1, momentum=0.9), 51)
    x, y = data(k * n * b, seed=17)
    y = y % 3
    before = params(m)
    for s in range(k):
        g0 = s * n * b
        m(tensor.from_numpy(x[g0 + r * b:g0 + (r + 1) * b]), y[g0 + r * b:g0 + (r + 1) * b])
        ref(tensor.from_numpy(x[g0:g0 + n * b]), y[g0:g0 + n * b])
    p = params(m)
    trained = [q for q in p if not np.array_equal(p[q], before[q])]
    result(d, rel=rel(p, params(ref)), ranks=ranks_max_diff(d, p), trained=sorted(trained),
           n_params=len(p))


def case_bn_checkpoint(a):
    """BatchNorm statistics stay local (SINGA) until sync_buffers; files only on rank 0."""
    d = opt.DistOpt(opt.SGD(lr=0.05))
    r, b = d.global_rank, a.batch
    rng = np.random.default_rng(r)         # different data on each rank
    m = build(BNNet, b, d, seed=61 + r)
    for _ in range(a.steps):
        xb = rng.standard_normal((b, 1, 6, 6)).astype(np.float32) * (1 + r)
        m(tensor.from_numpy(xb), rng.integers(0, N_CLASSES, b).astype(np.int32))
    states = m.get_states()
    bufs = {q: t.numpy().copy() for q, t in states.items() if not t.stores_grad}
    p = params(m)
    local_diff = ranks_max_diff(d, bufs)
    mean = {q: d.all_reduce_mean(v) for q, v in bufs.items()}
    d.sync_buffers(m)
    synced = {q: t.numpy() for q, t in m.get_states().items() if not t.stores_grad}
    sync_err = max(float(np.abs(synced[q] - mean[q]).max()) for q in bufs)
    out = a.out
    ck = m.save_states(os.path.join(out, f"ckpt_rank{r}.npz"))
    ox = m.export(os.path.join(out, f"model_rank{r}.onnx"))
    d.communicator.barrier()
    written = sorted(f for f in os.listdir(out) if f.startswith(("ckpt_", "model_")))
    result(d, params_ranks=ranks_max_diff(d, p), buffers_ranks=local_diff,
           buffers_after_sync=ranks_max_diff(d, synced), sync_err=sync_err, written=written,
           returned=[os.path.basename(ck), os.path.basename(ox)])


def case_failure(a):
    """A rank fails at step 3: killed (SIGKILL), raises, or stops taking part."""
    d = opt.DistOpt(opt.SGD(lr=0.1), timeout=a.timeout)
    n, r, b = d.world_size, d.global_rank, a.batch
    x, y = data(20 * n * b)
    m = build(MLP, b, d, seed=1)
    for s in range(20):
        if r == n - 1 and s == 3:
            if a.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif a.mode == "raise":
                raise ValueError("rank failure injected by the test")
            elif a.mode == "hang":
                time.sleep(3600)
        sl = slice(s * n * b + r * b, s * n * b + (r + 1) * b)
        m(tensor.from_numpy(x[sl]), y[sl])
        print(f"rank {r} step {s} done", flush=True)
    result(d, finished=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threshold", type=int, default=2097152)
    ap.add_argument("--mode", default="topk")
    ap.add_argument("--spars", type=float, default=0.1)
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--out", default=".")
    ap.add_argument("--log", default=None,
                    help="write each rank's stderr to LOG/rank<r>.err as well (MPICH's mpiexec "
                         "may stop forwarding the survivors' output when a rank was killed)")
    a = ap.parse_args(argv)
    if a.log:
        rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
        fd = os.open(os.path.join(a.log, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT, 0o644)
        os.dup2(fd, 2)
    globals()["case_" + a.case](a)


if __name__ == "__main__":
    sys.exit(main())
