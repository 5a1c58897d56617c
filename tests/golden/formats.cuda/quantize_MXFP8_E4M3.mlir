// golden lowering: formats.cuda / quantize_MXFP8_E4M3; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x256xbf16>) -> (tensor<256x256xf8E4M3FN> {jax.result_info = "result[0]"}, tensor<256x8xf8E8M0FNU> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %0:2 = stablehlo.custom_call @gpuext_quantize(%arg0, %cst) {backend_config = "", mhlo.backend_config = {axis = -1 : i64, format = 0 : i32, fp4_packed = 0 : i32, scale_rounding = 0 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<> : tensor<0xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>]} : (tensor<256x256xbf16>, tensor<f32>) -> (tensor<256x256xf8E4M3FN>, tensor<256x8xf8E8M0FNU>)
    return %0#0, %0#1 : tensor<256x256xf8E4M3FN>, tensor<256x8xf8E8M0FNU>
  }
}
