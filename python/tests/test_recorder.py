"""parity_bridge.Recorder on a small torch module tree (needs torch)."""
import unittest

import numpy as np

from util import have_torch


@unittest.skipUnless(have_torch(), "torch is not installed")
class RecorderTest(unittest.TestCase):
    def setUp(self):
        import torch
        from torch import nn
        torch.manual_seed(0)

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.decoder = nn.Module()
                self.decoder.layers = nn.ModuleList([nn.Linear(4, 4, bias=False) for _ in range(2)])
                self.out = nn.Linear(4, 3, bias=False)

            def forward(self, x):
                for layer in self.decoder.layers:
                    x = torch.tanh(layer(x))
                return self.out(x)

        self.torch, self.net = torch, Net().double()

    def test_activations_gradients_and_names(self):
        from parity_bridge import Recorder
        torch = self.torch
        x = torch.randn(2, 5, 4, dtype=torch.float64)
        rec = Recorder(self.net,
                       activations={"decoder.layers.0": "act.layers.0", "out": "out.logits"},
                       output_grads={"decoder.layers.1": "dact.layers.1"},
                       params=lambda p: p.replace("decoder.", "").replace("out.weight", "head.weight"),
                       transform={"act.layers.0": lambda t: t * 1})
        with rec:
            y = self.net(x)
            y.sum().backward()
        h0 = self.net.decoder.layers[0](x)
        self.assertTrue(np.array_equal(rec.records["act.layers.0"], h0.detach().numpy()))
        self.assertTrue(np.array_equal(rec.records["out.logits"], y.detach().numpy()))
        self.assertEqual(rec.records["dact.layers.1"].shape, (2, 5, 4))
        g = rec.grads()
        self.assertEqual(set(g), {"grad.layers.0.weight", "grad.layers.1.weight", "grad.head.weight"})
        self.assertTrue(np.array_equal(g["grad.head.weight"], self.net.out.weight.grad.numpy()))

    def test_micro_batches_concatenate_in_order(self):
        from parity_bridge import Recorder
        torch = self.torch
        x = torch.randn(4, 3, 4, dtype=torch.float64)
        rec = Recorder(self.net, activations={"out": "out.logits"})
        with rec:
            for mb in (x[:2], x[2:]):  # two micro-batches of the global batch
                self.net(mb)
        self.assertTrue(np.allclose(rec.records["out.logits"], self.net(x).detach().numpy(), rtol=0, atol=1e-15))
        with self.assertRaises(KeyError):
            Recorder(self.net, activations={"decoder.layers.7": "act.layers.7"}).attach()
