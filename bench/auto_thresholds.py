#!/usr/bin/env python3
"""Does compression pay on this machine? Where compressor=auto's model puts the break-even.

Run on 2 or more ranks (docs/does-compression-pay.md):

    build/tools/gradcomm-run -n 2 -- /usr/bin/python3 bench/auto_thresholds.py --numel 4194304

One allreduce with compressor=auto of a gradient-like tensor (normal, heavy-tailed) makes the
engine measure every candidate's encode and decode on this host and probe the link, exactly
as in a job. From its report (gradcomm.stats()["auto_choices"]: predicted seconds per
candidate, their compute part and payload bytes, alpha, beta), rank 0 prints, per candidate, the
link rate below which (sending fewer bytes) or above which (sending more) the model predicts it
beats `none` and `bf16` (the 16-bit baseline), for this tensor size and world size, with no
overlap (a caller that waits at once). --json writes the same as a record.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

import gradcomm


def wire_s(shape, payload, alpha, spb, n_ranks, small_bytes):
    """src/auto_choice.cc predict_wire_s, the same formulas."""
    n = n_ranks
    if shape == "dense" and payload <= small_bytes:
        return math.ceil(math.log2(n)) * (alpha + payload * spb)
    if shape in ("dense", "codec"):
        return 2 * (n - 1) * (alpha + payload / n * spb)
    return 2 * (n - 1) * alpha + (n - 1) * payload * spb


def shape_of(spec):
    if spec == "none":
        return "dense"
    return "sparse" if spec.startswith("topk") else "codec"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numel", type=int, default=1 << 22)
    ap.add_argument("--spec", default="auto", help="the auto spec (its among= candidates are priced)")
    ap.add_argument("--json", help="write the result here (rank 0)")
    args = ap.parse_args()
    gradcomm.init()
    rng = np.random.default_rng(1 + gradcomm.rank())
    x = (rng.standard_normal(args.numel) * np.where(rng.random(args.numel) < 0.02, 20, 1)).astype(np.float32)
    gradcomm.allreduce(x, op="avg", compression=args.spec, name="thresholds")
    [choice] = [c for c in gradcomm.stats()["auto_choices"] if c["key"] == "thresholds"]
    n_ranks = gradcomm.size()
    small_bytes = int(os.environ.get("GRADCOMM_SMALL_ALLREDUCE_BYTES", 128 << 10))  # recursive_doubling.cc
    alpha, spb = choice["alpha_s"], 1.0 / choice["bytes_per_s"]
    rows = []
    for spec, predicted in choice["predicted_s"].items():
        if predicted is None:
            rows.append(dict(candidate=spec, left_out=choice["left_out"].get(spec, "")))
            continue
        shape = shape_of(spec)
        payload = choice["payload_bytes"][spec]
        compute = choice["compute_s"][spec]
        rows.append(dict(candidate=spec, predicted_s=predicted, compute_s=compute, payload_bytes=payload,
                         shape=shape))
    priced = {r["candidate"]: r for r in rows if "compute_s" in r}

    def break_even(a, b):
        """Where a beats b: ("below", rate) when a sends fewer bytes, ("above", rate) when it
        sends more; rate in bytes/s, inf: at any rate, None: at none."""
        ra, rb = priced[a], priced[b]
        # t = compute + k_alpha * alpha + bytes_coef * spb; solve t_a = t_b for spb.
        def coef(r):
            c1 = wire_s(r["shape"], r["payload_bytes"], 0.0, 1.0, n_ranks, small_bytes)
            c0 = wire_s(r["shape"], r["payload_bytes"], alpha, 0.0, n_ranks, small_bytes)
            return r["compute_s"] + c0, c1
        ka, sa = coef(ra)
        kb, sb = coef(rb)
        if sa == sb:
            return ("below", math.inf if ka < kb else None)
        s = (ka - kb) / (sb - sa)  # spb at which they tie
        if sa < sb:  # fewer bytes: a wins on slow links, below the tie
            return ("below", math.inf if s <= 0 else 1.0 / s)
        return ("above", None if s <= 0 else 1.0 / s)  # more bytes: a wins on fast links

    for r in rows:
        if "compute_s" not in r:
            continue
        for base in ("none", "bf16"):
            if base in priced and base != r["candidate"]:
                r[f"beats_{base}"] = break_even(r["candidate"], base)
    if gradcomm.rank() == 0:
        print(f"auto_thresholds: {args.numel} float32 elements on {n_ranks} ranks; measured link: "
              f"alpha {alpha * 1e6:.1f} us, {1 / spb / 1e6:.1f} MB/s; chosen here: {choice['chosen']}")
        print(f"{'candidate':<22} {'compute (ms)':>12} {'payload (MB)':>12} {'beats none':>22} {'beats bf16':>22}")

        def rate(v):
            if v is None:
                return "-"
            side, r = v
            if r is None:
                return "never"
            if r == math.inf:
                return "always"
            return f"{side} {r * 8 / 1e9:.2f} Gbit/s"

        for r in rows:
            if "compute_s" not in r:
                print(f"{r['candidate']:<22} left out: {r['left_out']}")
                continue
            print(f"{r['candidate']:<22} {r['compute_s'] * 1e3:>12.3f} {r['payload_bytes'] / 1e6:>12.3f} "
                  f"{rate(r.get('beats_none')):>22} {rate(r.get('beats_bf16')):>22}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(numel=args.numel, ranks=n_ranks, alpha_s=alpha, bytes_per_s=1 / spb,
                               chosen=choice["chosen"], candidates=rows), f, indent=1,
                          default=str)


if __name__ == "__main__":
    sys.exit(main())
