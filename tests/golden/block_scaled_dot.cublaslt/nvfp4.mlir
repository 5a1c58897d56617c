// golden lowering: block_scaled_dot.cublaslt / nvfp4; jax 0.10.2, jaxlib 0.10.2; python scripts/update_golden.py
module @golden attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<64x256xf4E2M1FN>, %arg1: tensor<64x16xf8E4M3FN>, %arg2: tensor<f32>, %arg3: tensor<128x256xf4E2M1FN>, %arg4: tensor<128x16xf8E4M3FN>, %arg5: tensor<f32>) -> (tensor<64x128xf32> {jax.result_info = "result"}) {
    %0 = stablehlo.reshape %arg0 : (tensor<64x256xf4E2M1FN>) -> tensor<1x64x256xf4E2M1FN>
    %1 = stablehlo.reshape %arg1 : (tensor<64x16xf8E4M3FN>) -> tensor<1x64x16xf8E4M3FN>
    %2 = stablehlo.reshape %arg3 : (tensor<128x256xf4E2M1FN>) -> tensor<1x128x256xf4E2M1FN>
    %3 = stablehlo.reshape %arg4 : (tensor<128x16xf8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    %4 = stablehlo.bitcast_convert %1 : (tensor<1x64x16xf8E4M3FN>) -> tensor<1x64x16xui8>
    %c = stablehlo.constant dense<7> : tensor<ui8>
    %5 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<ui8>) -> tensor<1x64x16xui8>
    %6 = stablehlo.shift_right_logical %4, %5 : tensor<1x64x16xui8>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1, 2] : (tensor<1x64x16xui8>) -> tensor<1x64x16x16xui8>
    %8 = stablehlo.reshape %7 : (tensor<1x64x16x16xui8>) -> tensor<1x64x256xui8>
    %c_0 = stablehlo.constant dense<3> : tensor<ui8>
    %9 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<ui8>) -> tensor<1x64x256xui8>
    %10 = stablehlo.shift_left %8, %9 : tensor<1x64x256xui8>
    %11 = stablehlo.bitcast_convert %0 : (tensor<1x64x256xf4E2M1FN>) -> tensor<1x64x256xui4>
    %12 = stablehlo.convert %11 : (tensor<1x64x256xui4>) -> tensor<1x64x256xui8>
    %13 = stablehlo.xor %12, %10 : tensor<1x64x256xui8>
    %14 = stablehlo.convert %13 : (tensor<1x64x256xui8>) -> tensor<1x64x256xui4>
    %15 = stablehlo.bitcast_convert %14 : (tensor<1x64x256xui4>) -> tensor<1x64x256xf4E2M1FN>
    %c_1 = stablehlo.constant dense<127> : tensor<ui8>
    %16 = stablehlo.broadcast_in_dim %c_1, dims = [] : (tensor<ui8>) -> tensor<1x64x16xui8>
    %17 = stablehlo.and %4, %16 : tensor<1x64x16xui8>
    %18 = stablehlo.bitcast_convert %17 : (tensor<1x64x16xui8>) -> tensor<1x64x16xf8E4M3FN>
    %19 = stablehlo.bitcast_convert %15 : (tensor<1x64x256xf4E2M1FN>) -> tensor<1x64x256xui4>
    %20 = stablehlo.convert %19 : (tensor<1x64x256xui4>) -> tensor<1x64x256xui8>
    %21 = stablehlo.slice %20 [0:1, 0:64, 0:256:2] : (tensor<1x64x256xui8>) -> tensor<1x64x128xui8>
    %22 = stablehlo.slice %20 [0:1, 0:64, 1:256:2] : (tensor<1x64x256xui8>) -> tensor<1x64x128xui8>
    %c_2 = stablehlo.constant dense<4> : tensor<ui8>
    %23 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<ui8>) -> tensor<1x64x128xui8>
    %24 = stablehlo.shift_left %22, %23 : tensor<1x64x128xui8>
    %25 = stablehlo.or %21, %24 : tensor<1x64x128xui8>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %26 = call @_pad(%18, %c_3) : (tensor<1x64x16xf8E4M3FN>, tensor<i32>) -> tensor<1x128x16xf8E4M3FN>
    %27 = stablehlo.reshape %26 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x1x4x32x4x4xf8E4M3FN>
    %28 = stablehlo.transpose %27, dims = [0, 1, 4, 3, 2, 5] : (tensor<1x1x4x32x4x4xf8E4M3FN>) -> tensor<1x1x4x32x4x4xf8E4M3FN>
    %29 = stablehlo.reshape %28 : (tensor<1x1x4x32x4x4xf8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    %30 = stablehlo.reshape %29 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x2048xf8E4M3FN>
    %31 = stablehlo.bitcast_convert %30 : (tensor<1x2048xf8E4M3FN>) -> tensor<1x2048xui8>
    %32 = stablehlo.bitcast_convert %3 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x128x16xui8>
    %c_4 = stablehlo.constant dense<7> : tensor<ui8>
    %33 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<ui8>) -> tensor<1x128x16xui8>
    %34 = stablehlo.shift_right_logical %32, %33 : tensor<1x128x16xui8>
    %35 = stablehlo.broadcast_in_dim %34, dims = [0, 1, 2] : (tensor<1x128x16xui8>) -> tensor<1x128x16x16xui8>
    %36 = stablehlo.reshape %35 : (tensor<1x128x16x16xui8>) -> tensor<1x128x256xui8>
    %c_5 = stablehlo.constant dense<3> : tensor<ui8>
    %37 = stablehlo.broadcast_in_dim %c_5, dims = [] : (tensor<ui8>) -> tensor<1x128x256xui8>
    %38 = stablehlo.shift_left %36, %37 : tensor<1x128x256xui8>
    %39 = stablehlo.bitcast_convert %2 : (tensor<1x128x256xf4E2M1FN>) -> tensor<1x128x256xui4>
    %40 = stablehlo.convert %39 : (tensor<1x128x256xui4>) -> tensor<1x128x256xui8>
    %41 = stablehlo.xor %40, %38 : tensor<1x128x256xui8>
    %42 = stablehlo.convert %41 : (tensor<1x128x256xui8>) -> tensor<1x128x256xui4>
    %43 = stablehlo.bitcast_convert %42 : (tensor<1x128x256xui4>) -> tensor<1x128x256xf4E2M1FN>
    %c_6 = stablehlo.constant dense<127> : tensor<ui8>
    %44 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<ui8>) -> tensor<1x128x16xui8>
    %45 = stablehlo.and %32, %44 : tensor<1x128x16xui8>
    %46 = stablehlo.bitcast_convert %45 : (tensor<1x128x16xui8>) -> tensor<1x128x16xf8E4M3FN>
    %47 = stablehlo.bitcast_convert %43 : (tensor<1x128x256xf4E2M1FN>) -> tensor<1x128x256xui4>
    %48 = stablehlo.convert %47 : (tensor<1x128x256xui4>) -> tensor<1x128x256xui8>
    %49 = stablehlo.slice %48 [0:1, 0:128, 0:256:2] : (tensor<1x128x256xui8>) -> tensor<1x128x128xui8>
    %50 = stablehlo.slice %48 [0:1, 0:128, 1:256:2] : (tensor<1x128x256xui8>) -> tensor<1x128x128xui8>
    %c_7 = stablehlo.constant dense<4> : tensor<ui8>
    %51 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<ui8>) -> tensor<1x128x128xui8>
    %52 = stablehlo.shift_left %50, %51 : tensor<1x128x128xui8>
    %53 = stablehlo.or %49, %52 : tensor<1x128x128xui8>
    %c_8 = stablehlo.constant dense<0> : tensor<i32>
    %54 = call @_pad_0(%46, %c_8) : (tensor<1x128x16xf8E4M3FN>, tensor<i32>) -> tensor<1x128x16xf8E4M3FN>
    %55 = stablehlo.reshape %54 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x1x4x32x4x4xf8E4M3FN>
    %56 = stablehlo.transpose %55, dims = [0, 1, 4, 3, 2, 5] : (tensor<1x1x4x32x4x4xf8E4M3FN>) -> tensor<1x1x4x32x4x4xf8E4M3FN>
    %57 = stablehlo.reshape %56 : (tensor<1x1x4x32x4x4xf8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    %58 = stablehlo.reshape %57 : (tensor<1x128x16xf8E4M3FN>) -> tensor<1x2048xf8E4M3FN>
    %59 = stablehlo.bitcast_convert %58 : (tensor<1x2048xf8E4M3FN>) -> tensor<1x2048xui8>
    %60 = stablehlo.reshape %arg2 : (tensor<f32>) -> tensor<f32>
    %61 = stablehlo.reshape %arg5 : (tensor<f32>) -> tensor<f32>
    %62 = stablehlo.multiply %60, %61 : tensor<f32>
    %63 = stablehlo.reshape %62 : (tensor<f32>) -> tensor<1xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %64 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1xf32>
    %65 = stablehlo.concatenate %63, %64, dim = 0 : (tensor<1xf32>, tensor<1xf32>) -> tensor<2xf32>
    %66:2 = stablehlo.custom_call @gpuext_block_scaled_dot_cublaslt(%25, %31, %53, %59, %65) {backend_config = "", mhlo.backend_config = {k = 256 : i64, lhs_scale_mode = 1 : i32, lhs_type = 2 : i32, rhs_scale_mode = 1 : i32, rhs_type = 2 : i32}, operand_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[2, 1, 0]> : tensor<3xindex>, dense<0> : tensor<1xindex>]} : (tensor<1x64x128xui8>, tensor<1x2048xui8>, tensor<1x128x128xui8>, tensor<1x2048xui8>, tensor<2xf32>) -> (tensor<1x64x128xf32>, tensor<33554688xui8>)
    %67 = stablehlo.reshape %66#0 : (tensor<1x64x128xf32>) -> tensor<64x128xf32>
    return %67 : tensor<64x128xf32>
  }
  func.func private @_pad(%arg0: tensor<1x64x16xf8E4M3FN>, %arg1: tensor<i32>) -> tensor<1x128x16xf8E4M3FN> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f8E4M3FN>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 64, 0], interior = [0, 0, 0] : (tensor<1x64x16xf8E4M3FN>, tensor<f8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    return %1 : tensor<1x128x16xf8E4M3FN>
  }
  func.func private @_pad_0(%arg0: tensor<1x128x16xf8E4M3FN>, %arg1: tensor<i32>) -> tensor<1x128x16xf8E4M3FN> {
    %0 = stablehlo.convert %arg1 : (tensor<i32>) -> tensor<f8E4M3FN>
    %1 = stablehlo.pad %arg0, %0, low = [0, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x128x16xf8E4M3FN>, tensor<f8E4M3FN>) -> tensor<1x128x16xf8E4M3FN>
    return %1 : tensor<1x128x16xf8E4M3FN>
  }
}
