"""`hf`: a Hugging Face causal LM of the Llama structure as a model family of the recipe.

`--model.name hf --model.hf_assets_path FOLDER` trains the model in FOLDER (config.json,
model.safetensors, tokenizer.json) converted by `[boost] arch` (`parallelize.to_low_rank`,
SVD initialisation from the pretrained weights), sharded by the library's plans on
`parallelize.hf_layout`. Every module and its job:

- `args`: `HfModelArgs`, the folder's config with TorchTitan's model-args protocol;
- `model`: the model class (the transformers class returning logits, loading the folder
  in `init_weights`);
- `spec`: the TrainSpec, its parallelize function and the job checks;
- `family`: the hooks `boost_titan.job` reaches this family through;
- `export`: a checkpoint written back as a Hugging Face folder.

transformers is imported only when a job names this family.
"""
