// Geometry of the convolution, baked into each pipeline as override constants
// (ConvShapeMeta::shape_constants). The batch size arrives at run time.
override H: u32;
override W: u32;
override C_IN: u32;
override C_OUT: u32;
override R: u32;
override S: u32;
override STRIDE_H: u32;
override STRIDE_W: u32;
override PAD_TOP: u32;
override PAD_LEFT: u32;
override DIL_H: u32;
override DIL_W: u32;
override H_OUT: u32;
override W_OUT: u32;
