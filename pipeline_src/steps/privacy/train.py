"""train_private: DP training of one method's tuned model in one regime, for one target ε, on
one shard (or, for N = 1, the whole training split), from the cached prefix features.

Protocol `ours`: DP-SGD with Poisson sampling (Abadi et al. 2016) through Opacus, as the DP
study of Liu & Soatto et al. 2024 ("Tangent Transformers for Composition, Privacy and Removal",
§3.4, Table 3); protocol `paper`: that paper's App. A, full-batch DP-GD with cross-entropy and,
for taft, J·Δw-only prediction (`dp/full_batch.py`); see `pipeline_src/dp/`. The whole tuned state is saved (the parts the regime
froze keep their public initial values), so evaluation and composition load it as any model.
The noise and sampling are secret (`dp.secret_randomness`); the record names no member: the
shard's ids go to the private provenance store (`private_provenance`), referenced by a keyed ref.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline_src.dp import InfeasibleBudget, train_private
from pipeline_src.dp.full_batch import train_private_full_batch
from pipeline_src.methods.fc_head import HeadOnly, head_call, head_inputs, only_head_trains
from pipeline_src.methods.kinds import kind_of
from pipeline_src.methods.private import per_example_loss, select_trainable
from pipeline_src.plan.privacy import (
    dp_method_config,
    dp_settings,
    epsilon_label,
    jvp_only_applies,
    public_shard_size,
)
from pipeline_src.plan.rdp_memo import StudyRdp
from pipeline_src.runner.step_args import StepArgs
from pipeline_src.steps.train import PREFIX_BATCH, load_job
from pipeline_src.store.model_io import save_model
from pipeline_src.store.private_provenance import results_root_of, store_members
from pipeline_src.vit.digest import state_digest
from pipeline_src.vit.parts import FromPrefix

# The paper protocol's micro-batches (`privacy.paper.micro_batch_size`, 512 in the default study)
# hold activations of 8-30 MiB, past the jobs' 4 MiB mmap threshold (runner/execute.py): each
# micro-batch mapped and unmapped them afresh, 0.7-1.0 M page faults and 2.0-2.9 of a job's 8-9.6
# CPU-s in the kernel. At 64 MiB they stay on the heap (0.1-0.2 s; peak RSS +40-60 MB, the same at
# any dataset size: the micro-batch is fixed).
MMAP_THRESHOLD = 64 << 20


def main(args: StepArgs) -> None:
    cfg, w = args.job_config(), args.wildcards  # public settings only (plan/step_settings.py: train_private)
    name, regime, protocol = w["method"], w["regime"], w["protocol"]
    shards, shard, seed = int(w["shards"]), int(w["shard"]), int(w["seed"])
    epsilon = float(args.params["epsilon"])  # the configured ε of the `eps` wildcard (plan.privacy.target_epsilon)
    if epsilon_label(epsilon) != w["eps"]:
        raise ValueError(f"train_private: param epsilon {epsilon:g} is not the job's wildcard 'eps{w['eps']}'")
    settings = dp_settings(cfg, protocol)
    method = cfg["methods"][name]
    method_cfg = dp_method_config(method, protocol,
                                  cfg["privacy"]["jvp_only"] if jvp_only_applies(method, protocol) else None)
    job = load_job(args, method_cfg)  # seeds the job, loads the backbone and the samples store
    model = job.new_model()  # the same head init as the non-private study, and in every shard
    t0 = time.perf_counter()
    # A view read per batch (CachedRows, or StoredImages running the prefix without a cache): each
    # Poisson batch (DP-SGD) or micro-batch (full-batch DP-GD) reads only its rows.
    ids, features, labels = job.shard_data(model, shard)
    method_flags = {n: p.requires_grad for n, p in model.named_parameters()}
    trained = select_trainable(model, method_cfg["kind"], regime, cfg["privacy"]["train_head"])
    desc = f"{name} {regime} eps {epsilon:g} n{shards} shard {shard} ({protocol} protocol)"
    full_batch = settings.get("full_batch", False)
    public_size = public_shard_size(cfg, shards)  # what the plan may reveal; len(ids) stays private
    steps_per_epoch = 1 if full_batch else -(-public_size // settings["batch_size"])

    def progress(s: dict) -> None:
        if s["step"] % steps_per_epoch == 0:
            print(f"{desc}: epoch {s['epoch'] + 1} step {s['step']} batch loss {s['loss']:.4f}", flush=True)

    common = dict(loss_fn=per_example_loss(method_cfg), epochs=settings["epochs"], lr=settings["lr"],
                  epsilon=epsilon, delta=settings["delta"], max_grad_norm=settings["max_grad_norm"],
                  mode=settings["mode"], accountant=settings["accountant"], progress=progress, public_size=public_size)
    module, inputs, head_files = FromPrefix(model), features, []
    call = head_call(model, method_cfg["kind"]) if regime == "fc" else None
    if call is not None and only_head_trains(model, call[0]):  # the tail once per sample, not once per step
        rows = head_inputs(model.eval(), *call, features, PREFIX_BATCH, args.output.model)
        module, inputs = HeadOnly(*call, [r is not None for r in rows]), [r for r in rows if r is not None]
        head_files = [r.path for r in inputs]
        print(f"{desc}: trains the head on its inputs, computed once per sample (methods/fc_head.py)", flush=True)
    try:
        if full_batch:
            _, privacy = train_private_full_batch(module, inputs, labels,
                                                  micro_batch_size=settings["micro_batch_size"], **common)
        else:
            _, privacy = train_private(module, inputs, labels, batch_size=settings["batch_size"],
                                       rdp=StudyRdp(_plan_cache(args.output.model)), **common)  # Opacus' σ, faster
    except InfeasibleBudget as e:
        raise InfeasibleBudget(f"config key 'privacy.epsilons' (ε = {epsilon:g}, public shard size {public_size}): "
                               f"{e}") from e
    finally:
        for f in head_files:
            f.unlink(missing_ok=True)
    for n, p in model.named_parameters():  # back to the method's trainable set, so trainable_state is complete
        p.requires_grad_(method_flags[n])
    record = {
        "kind": "private", "method": name, "method_config": method_cfg, "regime": regime,
        "trained_parameters": trained, "dp_settings": settings, "privacy": privacy,
        "experiment": cfg["experiment"], "shards": shards, "shard_id": shard, "seed": seed, "head_seed": job.head_seed,
        "num_classes": job.num_classes, "backbone_digest": state_digest(job.backbone.state_dict()),
        # members by a keyed ref into the private store only, and no true size: a DP model's files never
        # name its members or reveal how many there are (privacy.public_size is the planned n̄)
        "membership_ref": store_members(results_root_of(args.output.model), ids),
        "device": str(job.device), "wall_time_s": time.perf_counter() - t0,
    }
    if kind_of(method_cfg).tangent:
        record["linearization_id"] = model.linearization_id()
    save_model(model.trainable_state(), record, args.output.model)
    print(f"DP-trained {desc} on {len(ids)} samples: σ {privacy['sigma']:.4f}, q {privacy['sample_rate']:.4g}, "
          f"{privacy['steps_taken']} steps, ε spent {privacy['epsilon_spent']:.4f} (δ {privacy['delta']:g})")


def _plan_cache(model_path: str) -> Path | None:
    """The study's plan cache, `results/<experiment>/prepare/.plan_cache` (the σ of each DP setting,
    `plan/rdp_memo.py`), or None outside a study's folder."""
    root = results_root_of(model_path)
    return root / "prepare" / ".plan_cache" if (root / "prepare").is_dir() else None
