# The privacy study (TAFT paper §3.4, Table 3): DP training per protocol x method x regime x
# epsilon x shard count x shard x seed from the cached features, DP taft shards composed by their
# Δw sum, every DP model evaluated. Protocol ours: Poisson DP-SGD; paper: the TAFT paper's
# full-batch DP-GD (App. A), see pipeline_src/plan/privacy.py. Its metrics join STUDY_METRICS (common.smk) when privacy.enabled,
# so `report` (and `all`) build them; `snakemake privacy` builds them alone.
from pipeline_src.methods.kinds import kind_of
from pipeline_src.plan.privacy import PROTOCOLS, dp_method_config, dp_settings, epsilon_label, privacy_jobs

PRIV = config["privacy"]
PRIVATE = f"{R}/private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}/n{{shards}}_s{{seed}}"
PRIVATE_METRICS = f"{R}/metrics/private/{{protocol}}/{{method}}/{{regime}}/eps{{eps}}/n{{shards}}_s{{seed}}"
PRIVATE_LOG = "{protocol}/{method}/{regime}/eps{eps}/n{shards}_s{seed}"


wildcard_constraints:
    regime="full|bitfit|layernorm|fc",
    protocol="|".join(PROTOCOLS),
    eps=r"[0-9][0-9.e+-]*",
    dp_model=r"shard\d+|soup|ensemble",


def private_signature(w):
    return private_signature_of(w.protocol, w.method)


def private_signature_of(protocol, method_name):
    """Canonical JSON of what determines a DP model besides its inputs and wildcards."""
    method = dp_method_config(config["methods"][method_name], protocol, PRIV["jvp_only"])
    dp = dp_settings(config, protocol)
    return json.dumps({"method": method, "dp": dp, "head_seed": config["seed"]}, sort_keys=True)


def private_shard_models(w):
    base = PRIVATE.format(**dict(w.items()))
    return [f"{base}/shard{i}.safetensors" for i in range(int(w.shards))]


def private_evaluation_inputs(w):
    inputs = {k: v for k, v in train_inputs_of(w.method, w.shards, w.seed).items() if k != "manifest"}
    base = PRIVATE.format(**dict(w.items()))
    if w.dp_model == "soup":
        inputs["models"] = [f"{base}/soup.safetensors"]
    elif w.dp_model == "ensemble":
        inputs["models"] = private_shard_models(w)
    else:
        inputs["models"] = [f"{base}/{w.dp_model}.safetensors"]
    return inputs


def private_evaluation_targets():
    """Every metrics file of the study: each DP shard model, and for N > 1 the Δw sum (taft)
    or the ensemble (other kinds) of the shards."""
    out = []
    for protocol, m, regime in privacy_jobs(config):
        composed = "soup" if kind_of(config["methods"][m]).tangent else "ensemble"
        for eps in PRIV["epsilons"]:
            for n in PRIV["shards"]:
                for s in SEEDS:
                    base = f"{R}/metrics/private/{protocol}/{m}/{regime}/eps{epsilon_label(eps)}/n{n}_s{s}"
                    out += [f"{base}/shard{i}.parquet" for i in range(n)]
                    if n > 1:
                        out.append(f"{base}/{composed}.parquet")
    return out


if PRIV["enabled"]:
    STUDY_METRICS.extend(private_evaluation_targets())


rule privacy:
    input:
        private_evaluation_targets(),


rule train_private:
    input:
        unpack(lambda w: shard_job_inputs(w, f"private-{w.protocol}-{w.method}")),
    output:
        model=f"{PRIVATE}/shard{{shard}}.safetensors",
        record=f"{PRIVATE}/shard{{shard}}.json",
    params:
        signature=private_signature,
    log:
        f"{R}/logs/train_private/{PRIVATE_LOG}/shard{{shard}}.log",
    benchmark:
        f"{R}/logs/train_private/{PRIVATE_LOG}/shard{{shard}}.bench.tsv"
    threads: RES["train_threads"]
    resources:
        mem_mb=mem_per_attempt(RES["train_mem_mb"]),
        gpu=RES["gpu"],
    script:
        "../scripts/step.py"


rule compose_private:
    input:
        models=private_shard_models,
    output:
        model=f"{PRIVATE}/soup.safetensors",
        record=f"{PRIVATE}/soup.json",
    log:
        f"{R}/logs/compose_private/{PRIVATE_LOG}/soup.log",
    benchmark:
        f"{R}/logs/compose_private/{PRIVATE_LOG}/soup.bench.tsv"
    script:
        "../scripts/step.py"


rule evaluate_private:
    input:
        unpack(private_evaluation_inputs),
    output:
        metrics=f"{PRIVATE_METRICS}/{{dp_model}}.parquet",
    params:
        model=lambda w: "dp-shard" if w.dp_model.startswith("shard") else f"dp-{w.dp_model}",
        shard_id=lambda w: int(w.dp_model.removeprefix("shard")) if w.dp_model.startswith("shard") else None,
    log:
        f"{R}/logs/evaluate_private/{PRIVATE_LOG}/{{dp_model}}.log",
    benchmark:
        f"{R}/logs/evaluate_private/{PRIVATE_LOG}/{{dp_model}}.bench.tsv"
    script:
        "../scripts/step.py"
