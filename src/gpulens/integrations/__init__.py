"""Framework integrations: the Lightning and Hugging Face Trainer callbacks and the experiment-tracker
bridges (W&B, MLflow, TensorBoard). They sit above the monitors and the diagnosis they glue together:
a callback drives a `TrainingMonitor` (workload/) and, at the end of training, hands the tracker the
job's findings (diagnose/) through the bridge's `findings` callback; the monitors themselves never
import diagnosis. Each framework is behind its extra and imported only by the module that needs it."""
