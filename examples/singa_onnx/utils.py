#
# Licensed to the Apache Software Foundation (ASF) under one
# or more contributor license agreements.  See the NOTICE file
# distributed with this work for additional information
# regarding copyright ownership.  The ASF licenses this file
# to you under the Apache License, Version 2.0 (the
# "License"); you may not use this file except in compliance
# with the License.  You may obtain a copy of the License at
#
#   http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing,
# software distributed under the License is distributed on an
# "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
# KIND, either express or implied.  See the License for the
# specific language governing permissions and limitations
# under th
#
# Ported from apache/singa examples/onnx/utils.py at commit 4ddb5629; only imports changed, and
# three Workbench additions marked below: the download folder (DOWNLOAD_DIR), the notice printed
# when a file there is an untrained stand-in rather than the real download, and the device the
# programs run on (pick_device: the GPU when there is one, else the CPU).

import os
import urllib.request
import tarfile
import glob
import onnx
import logging
from workbench import device
logging.basicConfig(level=logging.INFO, format='%(asctime)-15s %(message)s')

# Workbench addition: SINGA's programs download into /tmp/; SINGA_ONNX_DOWNLOAD_DIR names another
# folder (ONNX Workbench's tests use a temporary one, so they never leave files in /tmp/)
DOWNLOAD_DIR = os.path.join(os.environ.get('SINGA_ONNX_DOWNLOAD_DIR') or '/tmp', '')

# Workbench addition: an untrained stand-in (an ONNX Workbench architecture twin, or a file an
# earlier test run left with a '.workbench-twin' marker beside it) is never used silently
_TWIN_KEY = 'workbench.twin_of'
_STAND_IN_MARKER = '.workbench-twin'
_TWIN_MAX_BYTES = 64 << 20      # stand-ins are small; real models are not parsed to check


def _check_stand_in_model(path, archive):
    if not path.endswith('.onnx') or os.path.getsize(path) > _TWIN_MAX_BYTES:
        return
    try:
        m = onnx.load(path, load_external_data=False)
    except Exception:
        return
    twin = {p.key: p.value for p in m.metadata_props}.get(_TWIN_KEY)
    if twin:
        print("NOTE: %s is an untrained stand-in (ONNX Workbench's architecture twin of %r), "
              "not the real model: its predictions mean nothing. Delete it and %s to "
              "download the real one." % (path, twin, archive), flush=True)


# Workbench addition: SINGA's programs hard-code the GPU (device.create_cuda_gpu()), which fails
# on a machine without one; the ports call pick_device(), which takes the GPU when cupy sees one
# and the CPU otherwise, and says which
def pick_device(id=0):
    if device.cuda_available():
        dev = device.create_cuda_gpu_on(id)
        print("device: CUDA GPU %d (cupy)" % id, flush=True)
        return dev
    try:
        import cupy  # noqa: F401
        why = "cupy sees no CUDA GPU"
    except ImportError:
        why = "cupy is not installed: pip install -e '.[gpu-cuda12]' or '.[gpu-cuda13]'"
    print("device: the CPU (no GPU: %s)" % why, flush=True)
    return device.create_cpu()


def download_model(url):
    download_dir = DOWNLOAD_DIR
    archive = check_exist_or_download(url)
    with tarfile.open(archive, 'r') as t:
        t.extractall(path=download_dir)
        names = t.getnames()
    for name in names:
        _check_stand_in_model(os.path.join(download_dir, name), archive)


def load_dataset(test_data_dir):
    # load inputs
    inputs = []
    inputs_num = len(glob.glob(os.path.join(test_data_dir, 'input_*.pb')))
    for i in range(inputs_num):
        input_file = os.path.join(test_data_dir, 'input_{}.pb'.format(i))
        onnx_tensor = onnx.TensorProto()
        with open(input_file, 'rb') as f:
            onnx_tensor.ParseFromString(f.read())
        inputs.append(onnx.numpy_helper.to_array(onnx_tensor))

    # load reference outputs
    ref_outputs = []
    ref_outputs_num = len(glob.glob(os.path.join(test_data_dir, 'output_*.pb')))
    for i in range(ref_outputs_num):
        output_file = os.path.join(test_data_dir, 'output_{}.pb'.format(i))
        onnx_tensor = onnx.TensorProto()
        with open(output_file, 'rb') as f:
            onnx_tensor.ParseFromString(f.read())
        ref_outputs.append(onnx.numpy_helper.to_array(onnx_tensor))
    return inputs, ref_outputs


def check_exist_or_download(url):
    download_dir = DOWNLOAD_DIR
    name = url.rsplit('/', 1)[-1]
    filename = os.path.join(download_dir, name)
    if not os.path.isfile(filename):
        logging.info("Downloading %s" % url)
        urllib.request.urlretrieve(url, filename)
    elif os.path.isfile(filename + _STAND_IN_MARKER):
        print("NOTE: %s is a stand-in an ONNX Workbench test run left there, not the real "
              "download: results from it mean nothing. Delete it and %s to download the real "
              "file." % (filename, filename + _STAND_IN_MARKER), flush=True)
    return filename
