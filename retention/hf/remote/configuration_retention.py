"""The transformers config of a retention export (`model_type` "retention"): config.json as export.py writes it, with
every field of the model's LMConfig under `retention_lm`, which `modeling_retention.py` builds the model from.

Written into every export in the retention layout beside modeling_retention.py and named by config.json's auto_map, so
`transformers.AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)` reads it. It imports transformers
only: the retention package never imports this file.
"""

from transformers import PretrainedConfig


class RetentionConfig(PretrainedConfig):
    """config.json of a retention export.

    Args:
        retention_lm: the model's LMConfig as a dict (dataclasses.asdict): every size and mixer setting.
        **kwargs: config.json's other fields (sizes, layer_pattern, rope_parameters, eos_token_id, ...), kept as
            attributes.
    """

    model_type = "retention"

    def __init__(self, retention_lm: dict | None = None, **kwargs):
        self.retention_lm = dict(retention_lm or {})
        kwargs.setdefault("tie_word_embeddings", self.retention_lm.get("tie_embeddings", True))
        super().__init__(**kwargs)
