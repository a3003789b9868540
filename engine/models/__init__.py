"""Model families (the Llama family) and the Hugging Face checkpoint loader."""
