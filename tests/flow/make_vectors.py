"""Generates tests/flow/vectors.json: flow-matching schedules and outpaint index maps computed with numpy.

The schedule is diffusers' FlowMatchEulerDiscreteScheduler (__init__ + set_timesteps) and the
pipelines' calculate_shift / get_timesteps, transcribed formula by formula in float64 (diffusers keeps
its training grid in float32; here it is float64, so values agree with diffusers to ~1e-7 and with
this script to ~1e-12). Fill maps are numpy.pad's 'edge' and 'reflect' modes.

Run: `$(scripts/oracle-venv.sh) tests/flow/make_vectors.py` from the repository root.
"""
import json
import math
import os

import numpy as np

T = 1000  # num_train_timesteps


def calculate_shift(image_seq_len, base_seq_len=256, max_seq_len=4096, base_shift=0.5, max_shift=1.15):
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    b = base_shift - m * base_seq_len
    return image_seq_len * m + b


def schedule(steps, shift=1.0, mu=None, spacing="diffusers"):
    dynamic = mu is not None
    # __init__: the training grid, shifted unless dynamic shifting is on.
    train = np.linspace(1, T, T)[::-1].copy() / T
    if not dynamic:
        train = shift * train / (1 + (shift - 1) * train)
    sigma_max, sigma_min = float(train[0]), float(train[-1])
    # set_timesteps
    if spacing == "diffusers":
        sigmas = np.linspace(sigma_max * T, sigma_min * T, steps) / T
    else:  # FluxPipeline passes sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        sigmas = np.linspace(1.0, 1 / steps, steps)
    if dynamic:
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
    else:
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    timesteps = sigmas * T
    sigmas = np.concatenate([sigmas, np.zeros(1)])
    return [float(x) for x in sigmas], [float(x) for x in timesteps]


def start_index(steps, strength):
    # StableDiffusion3Img2ImgPipeline.get_timesteps
    init_timestep = min(steps * strength, steps)
    return int(max(steps - init_timestep, 0))


def main():
    schedules = []
    for steps in (1, 2, 4, 28, 50, 1000):
        for spacing in ("diffusers", "flux"):
            for shift in (1.0, 3.0, 0.5, 6.0):
                if steps == 1000 and shift in (0.5, 6.0):
                    continue
                s, t = schedule(steps, shift=shift, spacing=spacing)
                schedules.append({"steps": steps, "spacing": spacing, "shift": shift, "sigmas": s, "timesteps": t})
            for seq in (256, 1024, 4096, 16384):
                if steps == 1000 and seq != 4096:
                    continue
                mu = calculate_shift(seq)
                s, t = schedule(steps, mu=mu, spacing=spacing)
                schedules.append(
                    {"steps": steps, "spacing": spacing, "image_seq_len": seq, "mu": mu, "sigmas": s, "timesteps": t}
                )
    strengths = [
        {"steps": n, "strength": st, "start": start_index(n, st)}
        for n in (1, 2, 4, 10, 28, 50)
        for st in (0.0, 0.1, 0.25, 0.3, 0.5, 0.6, 0.7, 0.75, 0.9, 1.0)
    ]
    fills = []
    for n in (1, 2, 3, 5, 7):
        for before, after in ((0, 0), (1, 2), (3, 0), (0, 9), (12, 13)):
            src = np.arange(n)
            for mode in ("edge", "reflect"):
                idx = np.pad(src, (before, after), mode=mode)
                fills.append({"n": n, "before": before, "after": after, "mode": mode, "index": idx.tolist()})
    out = {"num_train_timesteps": T, "schedules": schedules, "strengths": strengths, "fills": fills}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(schedules)} schedules, {len(strengths)} strengths, {len(fills)} fills to {path}")


if __name__ == "__main__":
    main()
