from setuptools import find_packages, setup

setup(
    name="sglang-lilicorr",
    version="0.1.0",
    description="LiLiCorr speculative decoding for SGLang: head, kernels, training, plugin, bench",
    python_requires=">=3.10",
    packages=find_packages(include=["sglang_lilicorr", "sglang_lilicorr.*"]),  # the product only: not benchmarks/
    install_requires=[
        "sglang==0.5.23",
        "torch==2.14.1",
        "triton==3.8.0",
        "transformers==5.19.0",
        "tokenizers==0.23.2",
        "safetensors>=0.4",
        "tqdm",
        "matplotlib",
        "aiohttp",
        "gguf",
    ],
    # mutation: scripts/mutation.sh (docs/MUTATION.md); it reads mutmut 3.8's results files, hence the exact pin
    extras_require={"test": ["pytest>=8"], "mutation": ["mutmut==3.8.1"]},
    entry_points={
        "console_scripts": ["lilicorr = sglang_lilicorr.cli:main"],
        # the lab's instrumentation plugin is none of the product's: benchmarks/instrumentation/entry_point registers it
        "sglang.srt.plugins": ["lilicorr = sglang_lilicorr.serving.plugin:register"],
    },
)
