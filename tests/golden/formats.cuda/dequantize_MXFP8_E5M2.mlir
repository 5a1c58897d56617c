// golden lowering: formats.cuda / dequantize_MXFP8_E5M2; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x256xf8E5M2>, %arg1: tensor<256x8xf8E8M0FNU>) -> (tensor<256x256xbf16> {jax.result_info = "result"}) {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0 = stablehlo.custom_call @gpuext_dequantize(%arg0, %arg1, %cst) {backend_config = "", mhlo.backend_config = {axis = -1 : i64, format = 1 : i32, fp4_packed = 0 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<> : tensor<0xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x256xf8E5M2>, tensor<256x8xf8E8M0FNU>, tensor<f32>) -> tensor<256x256xbf16>
    return %0 : tensor<256x256xbf16>
  }
}
