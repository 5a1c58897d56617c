// golden lowering: formats.cuda / dequantize_NVFP4; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x256xf4E2M1FN>, %arg1: tensor<256x16xf8E4M3FN>, %arg2: tensor<f32>) -> (tensor<256x256xbf16> {jax.result_info = "result"}) {
    %0 = stablehlo.custom_call @gpuext_dequantize(%arg0, %arg1, %arg2) {backend_config = "", mhlo.backend_config = {axis = -1 : i64, format = 2 : i32, fp4_packed = 1 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<> : tensor<0xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x256xf4E2M1FN>, tensor<256x16xf8E4M3FN>, tensor<f32>) -> tensor<256x256xbf16>
    return %0 : tensor<256x256xbf16>
  }
}
