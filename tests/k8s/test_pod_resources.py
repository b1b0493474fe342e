"""Pod attribution through the kubelet's pod-resources API, against a real gRPC server generated (by
grpcio-tools, at test time) from src/gpulens/k8s/podresources_v1.proto and served on a unix socket, as
the kubelet serves it: the client's hand-written decoder must read what protobuf's encoder wrote, and
the agent's GPU and process series must carry the pod that holds each GPU."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testlib import free_port, import_or_skip

import_or_skip("grpc", "pod attribution needs grpcio (the k8s extra)")

from gpulens.errors import BackendUnavailableError  # noqa: E402
from gpulens.gpu import FakeBackend  # noqa: E402
from gpulens.k8s.attribution import ContainerRef, DeviceAttribution  # noqa: E402
from gpulens.k8s.podresources import PodResourcesClient, PodResourcesPoller  # noqa: E402
from gpulens.k8s.wire import WireError, decode_list_response  # noqa: E402
from gpulens.pipeline import NodeConfig, build_node  # noqa: E402

GPU0, GPU1 = "GPU-fake-0000-0000", "GPU-fake-0000-0001"


def test_client_reads_which_container_holds_which_gpu(kubelet):
    kubelet.pods = [
        kubelet.pod("ml", "trainer-0", {"main": {"nvidia.com/gpu": [GPU0]}, "sidecar": {"example.com/nic": ["eth9"]}}),
        kubelet.pod("serve", "vllm-7f9", {"engine": {"nvidia.com/gpu": [GPU1], "nvidia.com/mig-1g.18gb": ["MIG-abc"]}}),
        kubelet.pod("kube-system", "coredns", {"coredns": {}}),
    ]
    client = PodResourcesClient(kubelet.socket)
    try:
        assert client.list_devices() == {
            GPU0: [ContainerRef("ml", "trainer-0", "main")],
            GPU1: [ContainerRef("serve", "vllm-7f9", "engine")],
            "MIG-abc": [ContainerRef("serve", "vllm-7f9", "engine")],
        }  # the NIC is not an NVIDIA device: left out
    finally:
        client.close()


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return {f.name: f for f in text_string_to_metric_families(r.read().decode())}


@pytest.mark.parametrize("names", ["gpulens", "dcgm"])
def test_agent_series_carry_the_pod_that_holds_the_gpu(kubelet, tmp_path, names):
    # two containers share GPU 1 (time-slicing): one series each, as dcgm-exporter writes them
    kubelet.pods = [
        kubelet.pod("ml", "trainer-0", {"main": {"nvidia.com/gpu": [GPU0]}}),
        kubelet.pod("serve", "vllm-a", {"engine": {"nvidia.com/gpu": [GPU1]}}),
        kubelet.pod("serve", "vllm-b", {"engine": {"nvidia.com/gpu": [GPU1]}}),
    ]
    fake = FakeBackend(gpus=3)
    fake.add_process(0, 4242, "python train.py", 8 * 2**30)
    node = build_node(NodeConfig(backend=fake, store_path=None, alerts=None, listen=("127.0.0.1", free_port()),
                                 metric_names=names, pod_resources_socket=kubelet.socket))
    try:
        node.loop.tick()
        fams = _scrape(node.metrics_url)
    finally:
        node.close()
    temp = "DCGM_FI_DEV_GPU_TEMP" if names == "dcgm" else "gpu_temperature_celsius"
    got = sorted((s.labels["gpu"], s.labels.get("namespace", ""), s.labels.get("pod", ""), s.labels.get("container", ""))
                 for s in fams[temp].samples)
    assert got == [("0", "ml", "trainer-0", "main"), ("1", "serve", "vllm-a", "engine"),
                   ("1", "serve", "vllm-b", "engine"), ("2", "", "", "")]  # GPU 2: held by no pod
    up = {(s.labels["gpu"], s.labels["pod"]) for s in fams["gpu_up"].samples}
    assert ("0", "trainer-0") in up
    if names == "gpulens":
        proc = fams["gpu_process_memory_bytes"].samples
        assert [(s.labels["pid"], s.labels["pod"], s.labels["namespace"]) for s in proc] == [("4242", "trainer-0", "ml")]


def test_a_mig_device_given_to_a_pod_labels_its_gpu_instance(kubelet):
    # NVIDIA's device plugin with the "mixed" MIG strategy hands out MIG devices by their own UUID
    fake = FakeBackend(gpus=2)
    fake.enable_mig(1, ["3g.71gb", "1g.18gb"])
    mig_uuid = fake.sample()[1].mig_instances[1].uuid
    kubelet.pods = [kubelet.pod("serve", "small-llm", {"engine": {"nvidia.com/mig-1g.18gb": [mig_uuid]}})]
    node = build_node(NodeConfig(backend=fake, store_path=None, alerts=None, listen=("127.0.0.1", free_port()),
                                 metric_names="dcgm", pod_resources_socket=kubelet.socket))
    try:
        node.loop.tick()
        fams = _scrape(node.metrics_url)
    finally:
        node.close()
    fb = {(s.labels["gpu"], s.labels.get("GPU_I_PROFILE", ""), s.labels.get("pod", "")) for s in fams["DCGM_FI_DEV_FB_USED"].samples}
    assert fb == {("0", "", ""), ("1", "3g.71gb", ""), ("1", "1g.18gb", "small-llm")}  # a MIG GPU: its instances only


@pytest.mark.parametrize("names", ["gpulens", "dcgm"])
def test_device_ids_by_index_attribute_like_uuids(kubelet, names):
    # NVIDIA's device plugin with --device-id-strategy=index reports "0" for GPU 0 and "<gpu>:<MIG slot>"
    # for a MIG device: the series carry the pod just as with UUIDs (they carried none before)
    fake = FakeBackend(gpus=3)
    fake.enable_mig(2, ["3g.71gb", "1g.18gb"])
    kubelet.pods = [
        kubelet.pod("ml", "trainer-0", {"main": {"nvidia.com/gpu": ["0"]}}),
        kubelet.pod("serve", "small-llm", {"engine": {"nvidia.com/mig-1g.18gb": ["2:1"]}}),
    ]
    node = build_node(NodeConfig(backend=fake, store_path=None, alerts=None, listen=("127.0.0.1", free_port()),
                                 metric_names=names, pod_resources_socket=kubelet.socket))
    try:
        node.loop.tick()
        fams = _scrape(node.metrics_url)
    finally:
        node.close()
    temp = "DCGM_FI_DEV_GPU_TEMP" if names == "dcgm" else "gpu_temperature_celsius"
    assert sorted((s.labels["gpu"], s.labels["pod"]) for s in fams[temp].samples) == [("0", "trainer-0"), ("1", ""), ("2", "")]
    if names == "dcgm":
        fb = {(s.labels["gpu"], s.labels.get("GPU_I_PROFILE", ""), s.labels["pod"]) for s in fams["DCGM_FI_DEV_FB_USED"].samples}
        assert ("2", "1g.18gb", "small-llm") in fb and ("2", "3g.71gb", "") in fb


def test_an_index_never_shadows_a_uuid():
    att = DeviceAttribution()
    by_uuid, by_index = ContainerRef("a", "p1", "c"), ContainerRef("a", "p2", "c")
    att.replace({GPU0: [by_uuid], "0": [by_index]})
    assert att.containers(GPU0, "0") == (by_uuid,)
    assert att.containers(GPU1, "1") == () and att.containers("GPU-other", "0") == (by_index,)


def test_without_attribution_the_labels_are_not_there(tmp_path):
    fake = FakeBackend(gpus=1)
    node = build_node(NodeConfig(backend=fake, store_path=None, alerts=None, listen=("127.0.0.1", free_port())))
    try:
        node.loop.tick()
        fams = _scrape(node.metrics_url)
    finally:
        node.close()
    assert set(fams["gpu_temperature_celsius"].samples[0].labels) == {"gpu", "uuid", "model", "host"}


def test_a_socket_nobody_serves_is_one_clear_sentence(tmp_path):
    with pytest.raises(BackendUnavailableError, match="pod-resources API at .* did not answer") as e:
        build_node(NodeConfig(backend=FakeBackend(gpus=1), store_path=None, alerts=None,
                              pod_resources_socket=str(tmp_path / "nobody.sock")))
    assert e.value.exit_code == 3 and "Mount /var/lib/kubelet/pod-resources" in str(e.value)


def test_the_agent_command_says_what_to_mount(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "gpulens.cli.main", "agent", "--backend", "fake", "--listen", "off",
                           "--store", str(tmp_path / "s.db"), "--duration", "1s", "--pod-resources", str(tmp_path / "none.sock")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "pod-resources API" in done.stderr and "Mount /var/lib/kubelet/pod-resources" in done.stderr


def test_poller_keeps_the_last_answer_while_the_kubelet_is_away(kubelet):
    kubelet.pods = [kubelet.pod("ml", "trainer-0", {"main": {"nvidia.com/gpu": [GPU0]}})]
    att = DeviceAttribution()
    poller = PodResourcesPoller(PodResourcesClient(kubelet.socket, timeout_seconds=1.0), att)
    try:
        assert poller.refresh() is True
        kubelet.stop()
        assert poller.refresh() is False
        assert att.containers(GPU0) == (ContainerRef("ml", "trainer-0", "main"),)
    finally:
        poller.close()


def test_decoder_reads_protobufs_encoding_and_rejects_a_truncated_reply(stubs):
    pb2, _ = stubs
    msg = pb2.ListPodResourcesResponse(pod_resources=[pb2.PodResources(name="p", namespace="n", containers=[
        pb2.ContainerResources(name="c", cpu_ids=[1, 300], devices=[pb2.ContainerDevices(resource_name="nvidia.com/gpu",
                                                                                         device_ids=["GPU-a", "GPU-b"])])])])
    wire = msg.SerializeToString()
    assert decode_list_response(wire) == [("n", "p", "c", "nvidia.com/gpu", ["GPU-a", "GPU-b"])]
    with pytest.raises(WireError):
        decode_list_response(wire[:-3])
