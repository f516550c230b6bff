"""The maths: the synthetic DGP, the generator g, the encoder f, the losses, the metrics and one run
(`Experiment`). Pure torch: no Ray, no files, no prints."""
