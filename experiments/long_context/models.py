"""The trained runs a long-context evaluation reads: each run folder's model, config, tokenizer and step, and the
same model with its RoPE rescaled past its training length (separate rows of a result).

A softmax layer's RoPE was trained at positions below the run's `data.seq_len` (T). Past T it is read as trained
("as trained") and with each scaling asked for, from the project's RoPE scalings (retention/nn/rope.py, Hugging
Face's rope types): "linear" divides every frequency by L / T (position interpolation), "llama3" divides the
wavelengths longer than T by L / T, keeps those shorter than T / 4 and blends between (Llama 3.1's, with T as its
original context). A model without a softmax layer that has RoPE, or read at L <= T, gets no such rows.
"""

import dataclasses

from flax import nnx

from experiments.compare.results import config_recipe_text
from experiments.plotting import label
from retention.data.tokenizer import ByteTokenizer, HFTokenizer
from retention.load import read_run, run_tokenizer
from retention.nn import LM
from retention.train.config import Config
from retention.train.record import config_from_dict
from retention.validation import check_choice

AS_TRAINED = "as trained"
ROPE_SCALINGS = ("linear", "llama3")  # the RoPE length extensions a row can read with (retention/nn/rope.py)


@dataclasses.dataclass(frozen=True)
class Trained:
    """A trained run's model as one row of a result: the folder, the run's model name, its Config and tokenizer
    (None: the bytes tokenizer, or a synthetic task), its checkpoint step and the RoPE it is read with."""

    folder: str
    model: LM
    config: Config
    tokenizer: HFTokenizer | None
    step: int
    rope: str = AS_TRAINED  # or one of ROPE_SCALINGS
    rope_factor: float | None = None  # the scaling's factor: L / the training length

    @property
    def name(self) -> str:
        """The run's model name (model.name), e.g. softmax or hybrid."""
        return self.config.model.name

    @property
    def label(self) -> str:
        """The row's label: the name with the layers' mixers and their recipe, and the RoPE scaling when not as
        trained."""
        kinds = self.model.config.layer_kinds
        text = label(self.name, f"{kinds}, {config_recipe_text(self.model.config, kinds)}")
        return text if self.rope == AS_TRAINED else f"{text}, RoPE {self.rope}"

    def text_tokenizer(self) -> ByteTokenizer | HFTokenizer:
        """The tokenizer of a text run: its own, or the bytes tokenizer (a bytes run keeps none)."""
        return self.tokenizer or ByteTokenizer()

    @property
    def key(self) -> tuple[str, str]:
        """What tells rows apart: (folder, RoPE)."""
        return self.folder, self.rope

    def describe(self) -> dict:
        """What a result records of the row: folder, name, layers, step, training length, RoPE, parameters."""
        return {
            "run": self.folder,
            "name": self.name,
            "label": self.label,
            "layer_kinds": self.model.config.layer_kinds,
            "step": self.step,
            "trained_length": self.config.data.seq_len,
            "rope": self.rope,
            "rope_factor": self.rope_factor,
            "params": self.model.param_count(),
        }


def load_trained(folder: str, tasks: tuple[str, ...]) -> Trained:
    """The newest intact checkpoint of the run in `folder` (or an export).

    Args:
        folder: a train.py run folder or an export folder.
        tasks: the data tasks the evaluation reads (e.g. ("text",)).

    Returns:
        The run as a Trained row (RoPE as trained).

    Raises:
        ValueError: the run trained on a task outside `tasks` (naming the folder and its task).
    """
    loaded = read_run(folder)
    config = config_from_dict(loaded.record["config"])
    if config.data.task not in tasks:
        raise ValueError(f"runs must be trained on {' or '.join(tasks)}, got {folder} trained on {config.data.task}")
    return Trained(folder, loaded.model, config, run_tokenizer(folder, loaded.record), loaded.step)


def has_rope_softmax(model: LM) -> bool:
    """Whether the model has a softmax layer (A) with RoPE."""
    return "A" in model.config.layer_kinds and model.config.for_kind("A").rope_base is not None


def rope_variants(trained: Trained, length: int, scalings: tuple[str, ...]) -> list[Trained]:
    """The row as trained, then one per RoPE scaling from its training length to `length` (module docstring).

    Args:
        trained: the run's row, RoPE as trained.
        length: the evaluation length L.
        scalings: some of ROPE_SCALINGS.

    Returns:
        [trained, *(its model with each scaling)]: only [trained] for a model without a RoPE softmax layer or
        when length <= its training length.
    """
    for scaling in scalings:
        check_choice("scalings[i]", scaling, ROPE_SCALINGS)
    T = trained.config.data.seq_len
    if length <= T or not has_rope_softmax(trained.model):
        return [trained]
    rows = [trained]
    for scaling in scalings:
        config = dataclasses.replace(
            trained.model.config, rope_scaling=scaling, rope_factor=length / T, rope_original_max_len=T
        )
        graphdef = nnx.graphdef(nnx.eval_shape(lambda c=config: LM(c, rngs=nnx.Rngs(0))))
        model = nnx.merge(graphdef, nnx.state(trained.model))
        rows.append(dataclasses.replace(trained, model=model, rope=scaling, rope_factor=length / T))
    return rows
