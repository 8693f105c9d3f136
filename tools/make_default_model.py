"""Make the embedded default model: SqueezeNet 1.0 from the onnx wheel's light models, with
seeded He-scaled random weights (deploytool.corpus.randomize_weights, seed 0). Deterministic:
rerunning it rewrites the same bytes."""

from pathlib import Path

import onnx

from deploytool.corpus import light_model_path, randomize_weights

OUT = Path(__file__).resolve().parents[1] / "deploytool" / "data" / "squeezenet1.0.onnx"

if __name__ == "__main__":
    model = randomize_weights(onnx.load(light_model_path("squeezenet")), seed=0)
    model.producer_name = "deploytool (light_squeezenet + randomize_weights seed 0)"
    onnx.save(model, OUT)
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e6:.1f} MB)")
