"""Training the target model on text: the trainable module, batched greedy generation and `train-target`."""
