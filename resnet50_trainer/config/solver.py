"""--solver FILE: a Caffe solver.prototxt (caffe_solver.py) made into the flags it means.

Every field the file sets is honoured (it becomes a flag's value), noted (it changes nothing here,
and the start says why) or refused in one line (it asks for what this trainer cannot do). Flags
given on the command line win over the file. Caffe counts in iterations and has no epochs; here an
epoch is test_interval iterations (Caffe tests every test_interval iterations, and so do we, after
each epoch), or the whole of max_iter where there is no test_interval, and every iteration count
becomes epochs of those: max_iter -> --num_epochs, stepsize/stepvalue -> --lr_steps. The lines
returned say what each field became.
"""

from __future__ import annotations

import argparse
import os
import re

from resnet50_trainer.config.caffe_solver import read_solver
from resnet50_trainer.config.flags.optimisation import NESTEROV, PLAIN_SGD
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.config.lr_policies import CAFFE_POLICIES
from resnet50_trainer.config.solver_translation import Translation, decimal, enum_name

# Caffe's solver types this trainer runs.
_SOLVER_TYPES = {"SGD": PLAIN_SGD, "Nesterov": NESTEROV, "NESTEROV": NESTEROV}
# Fields that change nothing here, and why.
_NOTED = {
    "test_compute_loss": "the test loss is not computed; test accuracy is",
    "test_initialization": "no test before the first iteration; tests follow each epoch",
    "average_loss": "the console prints each iteration's loss, the log each epoch's mean",
    "debug_info": "no per-layer debug output",
    "snapshot_after_train": "the last epoch is always saved",
    "snapshot_diff": "checkpoints hold weights and optimizer state, not gradients",
    "snapshot_format": "checkpoints are PyTorch files (.pt)",
    "layer_wise_reduce": "DDP overlaps its gradient all-reduce with the backward pass anyway",
    "delta": "read only by solver types this trainer does not run",
    "momentum2": "read only by solver types this trainer does not run",
    "rms_decay": "read only by solver types this trainer does not run",
}
_NET_NAME = re.compile(r'^\s*name\s*:\s*"([^"]*)"', re.MULTILINE)


def with_solver(
    args: argparse.Namespace, given: set[str], launched: Launched | None
) -> tuple[argparse.Namespace, list[str]]:
    """A copy of the parsed flags with --solver's file applied beneath the flags `given` on the
    command line; and the lines that say what each field of the file became."""
    path = args.solver
    translation = _Translation(read_solver(path), path, given, args, launched)
    translation.read_fields()
    machines = launched.num_machines if launched is not None else args.num_shards
    translation.turn_iterations_into_epochs(args.batch_size * machines)
    applied = argparse.Namespace(**vars(args))
    for dest, value in translation.values.items():
        if dest not in translation.given:
            setattr(applied, dest, value)
    return applied, [f"--solver {path}: {line}" for line in translation.lines]


class _Translation(Translation):
    """The solver file's fields read into flags."""

    def read_fields(self) -> None:
        solver = self.solver
        self._read_nets()
        self._read_policy()
        self._read_solver_type()
        if self.has("base_lr"):
            self.set_flag("base_lr", "base_learning_rate", decimal(solver.base_lr))
            if not {"base_learning_rate", "lr_scaling"} & self.given:
                self.set_flag("base_lr", "lr_scaling", "none", ": Caffe's base_lr is the LR itself")
        for field in ("momentum", "weight_decay"):
            if self.has(field):
                self.set_flag(field, field, decimal(getattr(solver, field)))
        if self.has("iter_size"):
            self.set_flag(
                "iter_size",
                "iter_size",
                solver.iter_size,
                ": --batch_size is the whole step here, Caffe's net batch x iter_size x GPUs",
            )
        if self.has("regularization_type") and solver.regularization_type != "L2":
            raise self.refuse(
                f"regularization_type {solver.regularization_type!r}: only L2 weight decay is "
                "done here; remove the line or use L2"
            )
        if self.has("clip_gradients") and solver.clip_gradients >= 0:
            raise self.refuse(
                f"clip_gradients {solver.clip_gradients:g}: gradients are not clipped here; "
                "remove the line"
            )
        self._read_outputs_and_devices()
        for field, why in _NOTED.items():
            if self.has(field):
                self.note(field, why)

    def _read_nets(self) -> None:
        solver = self.solver
        for field in ("net", "train_net", "test_net"):
            for net in getattr(solver, field) if field == "test_net" else [getattr(solver, field)]:
                if net:
                    self._check_net(field, net)
        if len(solver.test_iter) > 1:
            raise self.refuse(
                f"test_iter has {len(solver.test_iter)} values, one per test net: this trainer "
                "tests one DB (--test_data); keep one value"
            )
        if len(solver.weights) > 1:
            raise self.refuse(
                "weights names several files: a run starts from one (--init_model); keep one"
            )
        if solver.weights:
            self.set_flag("weights", "init_model", solver.weights[0])

    def _check_net(self, field: str, net: str) -> None:
        """A net file is not read, but for its name: it must be a ResNet (or ResNeXt), which
        --num_layers builds."""
        match = None
        if os.path.isfile(net):  # never a FIFO, whose open would wait for a writer
            try:
                with open(net, encoding="utf-8", errors="replace") as file:
                    match = _NET_NAME.search(file.read(1 << 16))
            except OSError:
                pass  # its file name then says what it is
        name = match.group(1) if match else os.path.basename(net)
        if "resne" not in name.lower():
            raise self.refuse(
                f"{field} {net!r} is not a ResNet ({name!r}): this trainer builds ResNet or "
                "ResNeXt from --num_layers, not the net a prototxt describes; remove the line"
            )
        self.note(f"{field} {net!r}", "the net is ResNet from --num_layers, the data --train_data")

    def _read_policy(self) -> None:
        solver = self.solver
        shaping = [
            field for field in ("gamma", "power", "stepsize", "stepvalue") if self.has(field)
        ]
        if not self.has("lr_policy"):
            if shaping:  # Caffe stops on a missing lr_policy too
                raise self.refuse(
                    f"sets {', '.join(shaping)} but no lr_policy to read them: add the lr_policy "
                    "they belong to"
                )
            return
        policy = solver.lr_policy
        if policy not in CAFFE_POLICIES:  # Caffe's sigmoid
            raise self.refuse(
                f"lr_policy {policy!r} is not one this trainer runs: use one of "
                f"{', '.join(CAFFE_POLICIES)}"
            )
        self.set_flag("lr_policy", "lr_policy", policy)
        if not self.policy_applies:
            for field in shaping:
                self.note(field, f"read by the file's lr_policy {policy}, not the command line's")
            return
        caffe = CAFFE_POLICIES[policy]
        reads = caffe.reads
        for field in shaping:
            if field not in reads:
                self.note(field, f"lr_policy {policy} does not read it (nor does Caffe's)")
        for field in reads:
            if not self.has(field):
                raise self.refuse(
                    f"lr_policy {policy} needs {field}, and the file has none: add it"
                )
        for field, flag in caffe.as_written:
            self.set_flag(field, flag, self._value(field))

    def _value(self, field: str) -> object:
        """A field's value; a float32 as written in the file (decimal)."""
        value = getattr(self.solver, field)
        return decimal(value) if isinstance(value, float) else value

    def _read_solver_type(self) -> None:
        solver = self.solver
        if self.has("type") and self.has("solver_type"):
            raise self.refuse(
                "sets both type and the old solver_type: Caffe refuses that too; keep type"
            )
        if self.has("type"):
            kind, field = solver.type, "type"
        elif self.has("solver_type"):
            kind = enum_name(solver, "SolverType", solver.solver_type)
            field = "solver_type"
        else:
            kind, field = "SGD", "type (not given: Caffe's default)"
        if kind not in _SOLVER_TYPES:
            raise self.refuse(
                f"{field} {kind!r}: this trainer runs SGD and Nesterov only; use one of those"
            )
        self.set_flag(field, "optimizer", _SOLVER_TYPES[kind])

    def _read_outputs_and_devices(self) -> None:
        solver = self.solver
        if self.has("display") and solver.display > 0:
            self.set_flag("display", "print_every", solver.display)
        if self.has("snapshot"):
            self.set_flag("snapshot", "checkpoint_every_iters", solver.snapshot)
        if self.has("snapshot_prefix"):
            directory, name = os.path.split(solver.snapshot_prefix)
            if directory:
                self.set_flag("snapshot_prefix", "checkpoint_dir", directory)
            if name:
                self.set_flag("snapshot_prefix", "save_model_name", name, " (name_EPOCH.pt)")
        if self.has("random_seed") and solver.random_seed >= 0:
            self.set_flag("random_seed", "seed", solver.random_seed)
        if enum_name(solver, "SolverMode", solver.solver_mode) == "CPU":
            self.set_flag("solver_mode", "use_cpu", True)
        elif self.has("device_id"):
            if self.launched is not None:
                self.note("device_id", f"{self.launched.name} places each process on its GPU")
            elif not {"gpus", "processes_per_machine", "use_cpu"} & self.given:
                self.set_flag("device_id", "gpus", (solver.device_id,))

    def turn_iterations_into_epochs(self, global_batch: int) -> None:
        """Caffe's iteration counts as epochs of this run's iterations (see the module's doc)."""
        solver, per_epoch = self.solver, None
        if "epoch_size" in self.given:
            per_epoch = max(1, self.args.epoch_size // global_batch)
            if solver.test_interval > 0:
                self.note(
                    "test_interval",
                    f"the command line's --epoch_size makes epochs of {per_epoch} iterations, "
                    "and tests follow each",
                )
        elif solver.test_interval > 0 or solver.max_iter > 0:
            per_epoch = solver.test_interval or solver.max_iter
            self.set_flag(
                "test_interval" if solver.test_interval else "max_iter",
                "epoch_size",
                per_epoch * global_batch,
                f": epochs of {per_epoch} iterations of the global batch of {global_batch}",
            )
        if solver.max_iter > 0:
            self._max_iter_as_epochs(per_epoch or solver.max_iter)
        elif "num_epochs" not in self.given:
            raise self.refuse("has no max_iter, so no end: add max_iter, or give --num_epochs")
        if solver.test_iter:
            images = solver.test_iter[0] * global_batch
            self.set_flag("test_iter", "test_epoch_size", images, f" ({global_batch} a batch)")
        policy = solver.lr_policy if self.policy_applies else None
        caffe = CAFFE_POLICIES.get(policy or "")
        if caffe is None or caffe.in_epochs is None:
            return
        if per_epoch is None:
            raise self.refuse(
                f"lr_policy {policy} counts iterations, and without test_interval or "
                "max_iter the iterations of an epoch are not known: add one of them, or "
                "give --epoch_size"
            )
        field, flag, convert, suffix = caffe.in_epochs
        self.set_flag(field, flag, convert(self._value(field), per_epoch), suffix)

    def _max_iter_as_epochs(self, per_epoch: int) -> None:
        max_iter = self.solver.max_iter
        if max_iter % per_epoch and "num_epochs" not in self.given:
            raise self.refuse(
                f"max_iter {max_iter} is not a whole number of epochs of {per_epoch} "
                f"iterations: runs end at an epoch's end here; make max_iter a multiple of "
                f"{per_epoch}, or give --num_epochs"
            )
        self.set_flag("max_iter", "num_epochs", max_iter // per_epoch)
