"""What the training loop reports: step and parameter statistics, model signals, loss recovery, goodput."""
