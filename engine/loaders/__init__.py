"""Reading models from disk: .kdtr fixtures, Hugging Face and DFlash directories, tokenizers."""
