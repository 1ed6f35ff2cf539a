"""The alpha-beta model over two levels (docs/two-levels.md), for bench/cluster/scaling.py.

N = M x L ranks: M nodes of L ranks. Between nodes each node has one link of B_n bytes/s each
way, shared by its L ranks, alpha_n per message; inside a node each rank has B_i bytes/s to
its peers (an NVLink-class fabric, or shared memory), alpha_i per message. S bytes of fp32 per
rank, n = S/4 elements; compute at the constants' per-core rates (scaling.py's Model).

Flat (ranks of a node consecutive in the ring; schedule of the library's flat call):
  dense ring       every step is as slow as its slowest hop, the one between nodes, which
                   carries one segment on its node's link:
                   T = 2(N-1) (alpha_n + S/N / B_n)
  codec ring       T = 2(N-1) (alpha_n + W/N / B_n) + S/R_enc + 2(N-1)/N S/R_dec
                   (W = the payload of the whole tensor; each rank encodes S, decodes 2(N-1)/N S)
  codec direct     each rank sends each other rank its segment: (N-L)/N of W leaves the node per
                   rank and phase, L ranks on one link:  T = 2 (N-1) alpha_n + 2 L (N-L)/N W / B_n + compute
  top-k allgather  the ring allgather: N-1 payloads P(n, k) cross each node link:
                   T = (N-1)(alpha_n + P / B_n) + S/R_sel + N k/R_entry + S/R_mem
Two levels (src/hierarchy.h): inside, a reduce-scatter and an allgather of the dense tensor,
  T_in = 2 (L-1)(alpha_i + S/L / B_i) + (L-1)/L S/R_reduce,
and across, each local rank's group of M (one rank per node) on its piece S/L, all L groups at
once on the node's link (so each step moves L x the piece's share: the link sees the whole):
  dense            T_x = 2(M-1)(alpha_n + S/M / B_n)
  codec ring       T_x = 2(M-1)(alpha_n + W/M / B_n) + (S/L)/R_enc + 2(M-1)/M (S/L)/R_dec
  codec direct     the same bytes and compute, 2(M-1) alpha_n
  top-k allgather  T_x = (M-1)(alpha_n + L P(n/L, k/L) / B_n) + (S/L)/R_sel + M k/L / R_entry + (S/L)/R_mem
Error of a codec's sum, relative L2 (quant:bits=4): the ring rounds every element once per hop,
e_ring(G) = e2 (G/2)^0.43 over G ranks (fit to bench/results/requant-2026-11-27.md: 0.204, 0.266,
0.362, 0.513 at G = 2, 4, 8, 16); the direct schedule rounds twice at any G: e_direct = 0.23. Over
two levels only the M ranks across round (inside is exact).
Assumed: full-bisection network between nodes; no contention inside a node; compute at one core
per rank; alpha per message on the sender; the phases one after another.
"""
import math
import re

GBIT = 1e9 / 8


class TwoLevels:
    def __init__(self, model, intra_bytes_per_s, alpha_intra_s):
        self.m = model
        self.S, self.n = model.S, model.n
        self.Bi, self.ai = intra_bytes_per_s, alpha_intra_s

    def inside(self, L, cs=1.0):
        if L == 1:
            return 0.0
        S = self.S
        # Reduce-scatter (reducing a chunk while the next moves) and allgather.
        return (2 * (L - 1) * self.ai + max((L - 1) / L * S / self.Bi, cs * (L - 1) / L * S / self.m.r_reduce)
                + (L - 1) / L * S / self.Bi)

    # ---- flat ----------------------------------------------------------------------------
    def flat_dense(self, N, L, Bn, an, cs=1.0):
        # The ring reduces a chunk while the next is on the wire (scaling.py's dense ring).
        S = self.S
        return 2 * (N - 1) * an + max(2 * (N - 1) / N * S / Bn, cs * (N - 1) / N * S / self.m.r_reduce)

    def _codec(self, spec):
        cd = self.m.c["ring_codecs"][spec]
        scales = cd["bucket_bytes"] * math.ceil(self.n / cd["bucket"]) if cd["bucket"] else 0
        W = self.S * cd["bits"] / 32 + scales
        return cd, W

    def flat_codec(self, spec, schedule, N, L, Bn, an, cs=1.0):
        cd, W = self._codec(spec)
        comp = self.S / cd["encode_bytes_per_s"] + 2 * (N - 1) / N * self.S / cd["decode_bytes_per_s"]
        if schedule == "ring":
            return 2 * (N - 1) * (an + W / N / Bn) + cs * comp
        return 2 * (N - 1) * an + 2 * L * (N - L) / N * W / Bn + cs * comp

    def flat_topk(self, r, N, L, Bn, an, cs=1.0):
        m, S = self.m, self.S
        k = m.k_of(r)
        P = m.payload(self.n, k, True, 2)
        comp = S / m.r_sel(r, "exact") + N * k / m.r_entry[True] + S / m.r_mem
        return (N - 1) * (an + P / Bn) + cs * comp

    # ---- two levels ----------------------------------------------------------------------
    def two_dense(self, N, L, Bn, an, cs=1.0):
        M = N // L
        S = self.S
        across = 2 * (M - 1) * an + max(2 * (M - 1) / M * S / Bn, cs * (M - 1) / M * S / L / self.m.r_reduce)
        return self.inside(L, cs) + (across if M > 1 else 0.0)

    def two_codec(self, spec, schedule, N, L, Bn, an, cs=1.0):
        M = N // L
        cd, W = self._codec(spec)
        piece = self.S / L
        comp = piece / cd["encode_bytes_per_s"] + 2 * (M - 1) / M * piece / cd["decode_bytes_per_s"]
        across = 2 * (M - 1) * (an + W / M / Bn) if M > 1 else 0.0
        return self.inside(L, cs) + across + cs * comp

    def two_topk(self, r, N, L, Bn, an, cs=1.0):
        m = self.m
        M = N // L
        k = m.k_of(r) / L
        P = m.payload(self.n / L, k, True, 2)
        piece = self.S / L
        comp = piece / m.r_sel(r, "exact") + M * k / m.r_entry[True] + piece / m.r_mem
        return self.inside(L, cs) + (M - 1) * (an + L * P / Bn) + cs * comp

    # ---- error ---------------------------------------------------------------------------
    @staticmethod
    def error(schedule, groups):
        if groups <= 1:
            return 0.0
        return 0.23 if schedule == "direct" else 0.204 * (groups / 2) ** 0.43


def table(tl, Ns, L, gbit, alpha_us):
    """Rows of the model table for one link rate: flat against two levels, ring against direct."""
    Bn, an = gbit * GBIT, alpha_us * 1e-6
    lines = [f"### {gbit} Gbit/s per node, alpha {alpha_us} us between nodes; {L} ranks per node", "",
             "| N | nodes | dense flat | dense 2-level | q4 ring flat | q4 direct flat | q4 ring 2-level | "
             "q4 direct 2-level | q4 error ring flat / direct 2-level | top-k 1% flat | top-k 1% 2-level | fastest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for N in Ns:
        if N % L:
            continue
        M = N // L
        t = {
            "dense flat": tl.flat_dense(N, L, Bn, an),
            "dense 2-level": tl.two_dense(N, L, Bn, an),
            "q4 ring flat": tl.flat_codec("quant:bits=4", "ring", N, L, Bn, an),
            "q4 direct flat": tl.flat_codec("quant:bits=4", "direct", N, L, Bn, an),
            "q4 ring 2-level": tl.two_codec("quant:bits=4", "ring", N, L, Bn, an),
            "q4 direct 2-level": tl.two_codec("quant:bits=4", "direct", N, L, Bn, an),
            "top-k flat": tl.flat_topk(0.01, N, L, Bn, an),
            "top-k 2-level": tl.two_topk(0.01, N, L, Bn, an),
        }
        best = min(t, key=t.get)
        err = f"{tl.error('ring', N):.2f} / {tl.error('direct', M):.2f}"
        cells = " | ".join(f"{v * 1e3:.1f}" for k, v in t.items() if not k.startswith("top-k"))
        lines.append(f"| {N} | {M} | {cells} | {err} | {t['top-k flat'] * 1e3:.1f} | {t['top-k 2-level'] * 1e3:.1f} "
                     f"| {best} |")
    return lines + [""]


def predict_record(tl, rec, cores):
    """Seconds the model gives a bench/cluster/run.sh --nodes record, compute shared as the VM's
    cores are (max(1, N / cores)); None for compressors it has no form for."""
    N, L = rec["ranks"], rec.get("ranks_per_node", 1)
    mm = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", rec["link_rate"])
    Bn = float(mm[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[mm[2]] / 8
    an = 30e-6
    cs = max(1.0, N / cores)
    two = rec.get("hierarchy", "auto") != "off" and L > 1 and N > L
    spec = rec["compressor"]
    schedule = rec.get("schedule", "auto")
    if schedule == "auto":
        schedule = "direct" if (N // L if two else N) >= 3 else "ring"
    if spec == "none":
        return tl.two_dense(N, L, Bn, an, cs) if two else tl.flat_dense(N, L, Bn, an, cs)
    if spec in tl.m.c["ring_codecs"]:
        return tl.two_codec(spec, schedule, N, L, Bn, an, cs) if two else tl.flat_codec(spec, schedule, N, L, Bn, an, cs)
    if spec == "topk:ratio=0.01":
        return tl.two_topk(0.01, N, L, Bn, an, cs) if two else tl.flat_topk(0.01, N, L, Bn, an, cs)
    return None
