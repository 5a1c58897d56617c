// golden lowering: block_scaled_dot.hopper_mx / mxfp8; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<2x64x256xf8E4M3FN>, %arg1: tensor<2x64x8xf8E8M0FNU>, %arg2: tensor<2x128x256xf8E4M3FN>, %arg3: tensor<2x128x8xf8E8M0FNU>) -> (tensor<2x64x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.bitcast_convert %arg1 : (tensor<2x64x8xf8E8M0FNU>) -> tensor<2x64x8xui8>
    %1 = stablehlo.convert %0 : (tensor<2x64x8xui8>) -> tensor<2x64x8xui32>
    %c = stablehlo.constant dense<0> : tensor<ui32>
    %2 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<ui32>) -> tensor<2x64x8xui32>
    %3 = stablehlo.compare EQ, %1, %2, UNSIGNED : (tensor<2x64x8xui32>, tensor<2x64x8xui32>) -> tensor<2x64x8xi1>
    %c_0 = stablehlo.constant dense<23> : tensor<ui32>
    %4 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<ui32>) -> tensor<2x64x8xui32>
    %5 = stablehlo.shift_left %1, %4 : tensor<2x64x8xui32>
    %c_1 = stablehlo.constant dense<4194304> : tensor<ui32>
    %6 = call @_where(%3, %c_1, %5) : (tensor<2x64x8xi1>, tensor<ui32>, tensor<2x64x8xui32>) -> tensor<2x64x8xui32>
    %c_2 = stablehlo.constant dense<255> : tensor<ui32>
    %7 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<ui32>) -> tensor<2x64x8xui32>
    %8 = stablehlo.compare EQ, %1, %7, UNSIGNED : (tensor<2x64x8xui32>, tensor<2x64x8xui32>) -> tensor<2x64x8xi1>
    %c_3 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %9 = call @_where(%8, %c_3, %6) : (tensor<2x64x8xi1>, tensor<ui32>, tensor<2x64x8xui32>) -> tensor<2x64x8xui32>
    %10 = stablehlo.bitcast_convert %9 : (tensor<2x64x8xui32>) -> tensor<2x64x8xf32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %11 = call @_pad(%10, %c_4) : (tensor<2x64x8xf32>, tensor<i32>) -> tensor<2x64x8xf32>
    %12 = stablehlo.transpose %11, dims = [0, 2, 1] : (tensor<2x64x8xf32>) -> tensor<2x8x64xf32>
    %13 = stablehlo.bitcast_convert %arg3 : (tensor<2x128x8xf8E8M0FNU>) -> tensor<2x128x8xui8>
    %14 = stablehlo.convert %13 : (tensor<2x128x8xui8>) -> tensor<2x128x8xui32>
    %c_5 = stablehlo.constant dense<0> : tensor<ui32>
    %15 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<ui32>) -> tensor<2x128x8xui32>
    %16 = stablehlo.compare EQ, %14, %15, UNSIGNED : (tensor<2x128x8xui32>, tensor<2x128x8xui32>) -> tensor<2x128x8xi1>
    %c_6 = stablehlo.constant dense<23> : tensor<ui32>
    %17 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<ui32>) -> tensor<2x128x8xui32>
    %18 = stablehlo.shift_left %14, %17 : tensor<2x128x8xui32>
    %c_7 = stablehlo.constant dense<4194304> : tensor<ui32>
    %19 = call @_where_0(%16, %c_7, %18) : (tensor<2x128x8xi1>, tensor<ui32>, tensor<2x128x8xui32>) -> tensor<2x128x8xui32>
    %c_8 = stablehlo.constant dense<255> : tensor<ui32>
    %20 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<ui32>) -> tensor<2x128x8xui32>
    %21 = stablehlo.compare EQ, %14, %20, UNSIGNED : (tensor<2x128x8xui32>, tensor<2x128x8xui32>) -> tensor<2x128x8xi1>
    %c_9 = stablehlo.constant dense<2143289344> : tensor<ui32>
    %22 = call @_where_0(%21, %c_9, %19) : (tensor<2x128x8xi1>, tensor<ui32>, tensor<2x128x8xui32>) -> tensor<2x128x8xui32>
    %23 = stablehlo.bitcast_convert %22 : (tensor<2x128x8xui32>) -> tensor<2x128x8xf32>
    %c_10 = stablehlo.constant dense<0> : tensor<i32>
    %24 = call @_pad_1(%23, %c_10) : (tensor<2x128x8xf32>, tensor<i32>) -> tensor<2x128x8xf32>
    %25 = stablehlo.transpose %24, dims = [0, 2, 1] : (tensor<2x128x8xf32>) -> tensor<2x8x128xf32>
    %26 = stablehlo.custom_call @gpuext_hopper_mx_dot(%arg0, %arg2, %12, %25) {backend_config = "", mhlo.backend_config = {config = 1 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[2, 1, 0]> : tensor<3xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>]} : (tensor<2x64x256xf8E4M3FN>, tensor<2x128x256xf8E4M3FN>, tensor<2x8x64xf32>, tensor<2x8x128xf32>) -> tensor<2x64x128xf32>
    return %26 : tensor<2x64x128xf32>
  }
  func.func private @_where(%arg0: tensor<2x64x8xi1>, %arg1: tensor<ui32>, %arg2: tensor<2x64x8xui32>) -> tensor<2x64x8xui32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<ui32>) -> tensor<2x64x8xui32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<2x64x8xi1>, tensor<2x64x8xui32>
    return %1 : tensor<2x64x8xui32>
  }
  func.func private @_pad(%arg0: tensor<2x64x8xf32>, %arg1: tensor<i32>) -> tensor<2x64x8xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<2x64x8xf32>, tensor<f32>) -> tensor<2x64x8xf32>
    return %1 : tensor<2x64x8xf32>
  }
  func.func private @_where_0(%arg0: tensor<2x128x8xi1>, %arg1: tensor<ui32>, %arg2: tensor<2x128x8xui32>) -> tensor<2x128x8xui32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [] : (tensor<ui32>) -> tensor<2x128x8xui32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<2x128x8xi1>, tensor<2x128x8xui32>
    return %1 : tensor<2x128x8xui32>
  }
  func.func private @_pad_1(%arg0: tensor<2x128x8xf32>, %arg1: tensor<i32>) -> tensor<2x128x8xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<2x128x8xf32>, tensor<f32>) -> tensor<2x128x8xf32>
    return %1 : tensor<2x128x8xf32>
  }
}
