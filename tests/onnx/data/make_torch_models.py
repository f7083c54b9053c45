"""How the PyTorch-exported test models in this folder were made (torch 2.13.0+cpu, onnxscript; not run by tests).

    python tests/onnx/data/make_torch_models.py   # in a venv with torch and onnxscript; rewrites this folder

(re-running gives the same weights; the protobuf bytes may differ in names and metadata)

- torch_resnetish_dynamo.onnx (+ .data): a small residual CNN, batch 1, torch.onnx.export(dynamo=True) - the
  new exporter, which stores weights as external data.
- torch_encoder_dyn_ts.onnx: nn.TransformerEncoder (2 layers), dynamic batch, TorchScript exporter.
- torch_encoder_b1_ts.onnx: the same with a fixed batch of 1; PyTorch's attention folds the batch into a
  Reshape of a sequence-first tensor, which lazybatch cannot undo: it must refuse this file.
"""

from pathlib import Path

import torch
import torch.nn as nn

HERE = Path(__file__).resolve().parent
torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(*[Block(16) for _ in range(3)])
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(self.blocks(torch.relu(self.stem(x))).flatten(1)), -1)


class Enc(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0), 2)
        self.out = nn.Linear(32, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.enc(self.emb(ids)).mean(1))


if __name__ == "__main__":
    names = {"input_names": ["x"], "output_names": ["y"]}
    torch.onnx.export(Net().eval(), (torch.randn(1, 3, 16, 16),), HERE / "torch_resnetish_dynamo.onnx",
                      dynamo=True, opset_version=18, **names)
    torch.manual_seed(0)
    enc = Enc().eval()
    torch.onnx.export(enc, (torch.randint(0, 100, (2, 12)),), HERE / "torch_encoder_dyn_ts.onnx", dynamo=False,
                      opset_version=17, dynamic_axes={"x": {0: "N"}, "y": {0: "N"}}, **names)
    torch.onnx.export(enc, (torch.randint(0, 100, (1, 12)),), HERE / "torch_encoder_b1_ts.onnx", dynamo=False,
                      opset_version=17, **names)
