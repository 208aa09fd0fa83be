"""`python -m retention.eval ARGS`: lm-eval's own command line (`lm_eval ARGS`) with this project's model registered
as `retention` (lm-eval 0.4 finds no model outside its package by itself):

    python -m retention.eval --model retention --model_args path=RUN_DIR --tasks hellaswag --batch_size 16
"""

from lm_eval.__main__ import cli_evaluate

import retention.eval.lm_eval_adapter  # noqa: F401  registers the model "retention"

if __name__ == "__main__":
    cli_evaluate()
