"""Standard evaluations: lm-eval's `LM` interface over this project's models (lm_eval_adapter.py; needs the `eval`
extra). Nothing here is imported by `import retention`: lm-eval (and what it imports) loads only when named."""
