#!/usr/bin/env bash
# Two heavy units together and two light together (A) against heavy+light twice (B), ABBA, 2 cores.
cd /tmp/pair/b
export PP4_CACHE_DIR=/work/main/.pp4-cache PATH=/work/main/.venv/bin:$PATH
O=build/exllamav2_ext/obj/exllamav2/exllamav2_ext
H1=$O/cuda/comp_units/unit_exl2_1b.cu.o; H2=$O/cuda/comp_units/unit_exl2_2b.cu.o
L1=$O/ext_qmatrix.cpp.o; L2=$O/ext_quant.cpp.o
ninja -j2 build/exllamav2_ext/.toolchain 2>/dev/null >/dev/null
pair() { rm -f "$2" "$3"; python3 /work/main/bench/accounting.py "$1" ninja -j2 "$2" "$3" 2>&1 | tail -1; }
for way in A B B A; do
  if [ $way = A ]; then pair "A heavy+heavy" $H1 $H2; pair "A light+light" $L1 $L2
  else pair "B heavy+light" $H1 $L1; pair "B heavy+light" $H2 $L2; fi
done
