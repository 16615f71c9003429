"""examples/kubernetes/resnet50-job.yaml against Kubernetes' own schemas (kubernetes-validate ships
them: no cluster, no network): a plain Service and Indexed Job, strict (no unknown field), whose
pods have the grace period a stop signal's save needs."""

from __future__ import annotations

import json
import os

import kubernetes_validate
import pytest

from tests.support.trainer_runs import REPOSITORY

JOB_FILE = os.path.join(REPOSITORY, "examples", "kubernetes", "resnet50-job.yaml")
# The oldest schemas kubernetes-validate ships (the file needs 1.24, for Indexed Jobs), and the
# newest.
VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def objects() -> list[dict]:
    """The file's objects: YAML written as JSON, comment lines aside."""
    with open(JOB_FILE) as file:
        text = "".join(line for line in file if not line.lstrip().startswith("#"))
    return json.loads(text)["items"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_kubernetes(version):
    assert [kubernetes_validate.validate(item, version, strict=True) for item in objects()]


def test_a_misspelt_field_would_be_refused():
    job = next(item for item in objects() if item["kind"] == "Job")
    job["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 120
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[-1], strict=True)


def test_the_pods_have_time_to_save_before_they_are_killed():
    job = next(item for item in objects() if item["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 120
